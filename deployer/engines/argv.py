"""What every engine's argv shares: the operator's extra words checked against an engine's managed flags (under
every spelling its parser accepts), the fields every engine takes from the same settings, and systemd's quoting of
the words into the unit's ``ExecStart=`` line.  Pure functions; each engine builds its own argv in its own module
(``vllm_argv.py``, ``sglang_argv.py``) from these parts."""
from __future__ import annotations

import re
from typing import Any

from deployer.host.module_utils import envfile, formats


class ServeConfigError(ValueError):
    """Bad deploy input; the message names the field, the value found and what is expected."""


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0].replace("_", "-") if arg.startswith("-") else ""


def owned_by(flag: str, managed: tuple[str, ...]) -> str:
    """The managed flag ``flag`` sets: itself, or the one it abbreviates.  "" when it sets none.

    Every spelling the engines' parsers accept counts (docs/security.md): argparse takes any unambiguous prefix
    as the whole flag (vLLM's FlexibleArgumentParser and SGLang's parser keep allow_abbrev on), so ``--ho`` IS
    ``--host``; vLLM merges a dotted sub-key into its parent (``--speculative-config.model X``); a boolean
    ``--no-X`` sets ``X``; vLLM turns ``_`` into ``-``."""
    if not flag:
        return ""
    flag = flag.split("=", 1)[0]
    if flag.startswith("--"):
        flag = "--" + flag[2:].replace("_", "-")
        flag = flag.split(".", 1)[0]                         # --speculative-config.model -> --speculative-config
    if flag in managed:
        return flag
    candidates = [flag]
    if flag.startswith("--no-"):
        candidates.append("--" + flag[5:])
    for f in candidates:
        if f in managed:
            return f
        if f.startswith("--") and len(f) > 2:
            hit = next((m for m in managed if m.startswith(f)), "")
            if hit:
                return hit
    return ""


def check_extra_args(extra: Any, managed: tuple[str, ...], what: str, forbidden: tuple[str, ...] = (),
                     secret_home: str = "the secret env file") -> list[str]:
    """``extra`` (the operator's free-form argv words), refused when a word sets a managed flag under any spelling
    (``owned_by``) or holds a control character (a unit-file line ends at ``\\r`` too: formats.py)."""
    if isinstance(extra, str) or not isinstance(extra, (list, tuple)) or not all(isinstance(a, str) for a in extra):
        raise ServeConfigError(f"{what}: got {extra!r}, expected a list of strings (one argv word each)")
    for a in extra:
        bad = formats.control_char(a)
        if bad:
            raise ServeConfigError(f"{what}: {a!r} contains the control character {bad}; a unit file line ends "
                                   "there (refused before anything changes)")
        for token in forbidden:
            if token in a:
                raise ServeConfigError(f"{what}: {a!r} contains a newline, NUL or {token}")
        flag = a if a.startswith("-") else ""
        owned = owned_by(flag, managed)
        if owned:
            shown = _flag_name(flag)
            how = "abbreviates" if owned.startswith(shown) else "sets"
            raise ServeConfigError(
                f"{what}: {shown} " + (f"{how} {owned}, which " if owned != shown else "")
                + "is set by the deployer from its own variable; set that variable instead"
                + (f" (the API key goes in {secret_home})" if "api-key" in owned else ""))
    return list(extra)


def common_fields(spec: dict) -> tuple[list[str], str, int, int, str]:
    """What every engine's argv needs, validated: launcher, model path, port, tensor-parallel size, served name (and
    ``host``, ``trust_remote_code``: the builders read them from ``spec`` once checked here)."""
    launcher = spec.get("launcher") or []
    if isinstance(launcher, str) or not launcher or not all(isinstance(a, str) and a for a in launcher):
        raise ServeConfigError(f"launcher: got {launcher!r}, expected a non-empty list of strings")
    model = spec.get("model")
    if not isinstance(model, str) or not model.startswith("/"):
        raise ServeConfigError(f"model: got {model!r}, expected an absolute path on the host")
    port = spec.get("port")
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise ServeConfigError(f"port: got {port!r}, expected an integer 1..65535")
    tp = spec.get("tensor_parallel_size")
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ServeConfigError(f"tensor_parallel_size: got {tp!r}, expected an integer >= 1")
    host = spec.get("host")
    if not isinstance(host, str) or not re.fullmatch(r"[A-Za-z0-9_.:%-]+", host):
        raise ServeConfigError(f"host: got {host!r}, expected the address to bind (e.g. 0.0.0.0, 127.0.0.1, ::)")
    if not isinstance(spec.get("trust_remote_code"), bool):
        raise ServeConfigError(f"trust_remote_code: got {spec.get('trust_remote_code')!r}, expected true or false")
    name = spec.get("served_model_name") or ""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/:-]{0,127}", name):
        raise ServeConfigError(f"served_model_name: got {name!r}, expected 1-128 chars of [A-Za-z0-9._/:-]")
    return list(launcher), model, port, tp, name


def common_spec(s: dict, venv: str, program: str) -> dict:
    """The argv fields every engine takes from the same settings (``common_fields`` validates them)."""
    launcher = s.get("launcher") or [f"{venv}/bin/{program}"]
    return {"launcher": [a.replace("{python}", f"{venv}/bin/python") for a in launcher],
            "model": s["model_dir"], "served_model_name": s["served_model_name"],
            "host": s["host"], "port": s["port"], "tensor_parallel_size": s["tensor_parallel_size"]}


def switch_flag(key: str, flag: str, value: Any) -> list[str]:
    """A flag-table render (vllm_argv.FLAGS, sglang_argv.FLAGS) for a boolean setting: the flag when true."""
    return [flag] if value else []


def num_word(x: float) -> str:
    s = repr(float(x))
    return s[:-2] if s.endswith(".0") else s


# --------------------------------------------------------------- systemd quoting
def systemd_exec_quote(arg: str) -> str:
    """Quote one word for ``ExecStart=`` (systemd.service(5) "Command lines"): the rule lives in
    module_utils/formats.py (``unit_word``: no control character, ``$`` and ``%`` escaped, double-quoted)."""
    try:
        return formats.unit_word(arg)
    except formats.FormatError as e:
        raise ServeConfigError(str(e)) from e


def systemd_env_quote(value: str) -> str:
    """Quote a value for an ``EnvironmentFile=`` line; the reader is beside the writer in envfile.py."""
    try:
        return envfile.quote(value)
    except envfile.EnvFileError as e:
        raise ServeConfigError(str(e)) from e


# A word that starts with this names a file in the unit's credentials directory (sglang_argv):
# written as systemd's ``%d`` specifier, the one specifier the deployer ever lets through.
CREDENTIALS_TOKEN = "{credentials}"


def exec_start(argv: list[str]) -> str:
    words = []
    for a in argv:
        q = systemd_exec_quote(a)
        if a.startswith(CREDENTIALS_TOKEN + "/"):
            q = '"%d' + q[1 + len(CREDENTIALS_TOKEN):]
        words.append(q)
    return " ".join(words)
