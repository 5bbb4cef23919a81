"""The ``vllm serve`` command line: built here and nowhere else.

Pure functions.  ``deployer.plan.make_plan`` calls ``build_serve_argv`` (the roles reach it
through the ``deployer_plan`` filter); the unit and env file templates use ``exec_start`` and
``systemd_env_quote`` (filters in ``deployer/ansible_plugins/filter_plugins/deployer_filters.py``).
"""
from __future__ import annotations

import json
import re
from typing import Any

from deployer.ansible_plugins.module_utils import envfile, formats

# Flags the deployer owns.  Free-form ``extra_args`` may not set them again (two
# sources of truth for the same flag is how a 25-minute load ends in surprise).
MANAGED_FLAGS = (
    "--served-model-name", "--host", "--port", "--tensor-parallel-size", "-tp",
    "--gpu-memory-utilization", "--max-model-len", "--max-num-seqs", "--trust-remote-code",
    "--speculative-config", "-sc", "--api-key", "--safetensors-load-strategy", "--model-loader-extra-config",
    # a YAML of flags (FlexibleArgumentParser expands it into the argv): it could set any of the above
    "--config", "--model",
)
# vLLM's LoadConfig.safetensors_load_strategy (vllm/config/load.py) and the default loader's only extra keys
# (DefaultModelLoader.__init__: {"enable_multithread_load", "num_threads"},
# vllm/model_executor/model_loader/default_loader.py)
# "prefetch" from vLLM 0.20 (its weight_utils.py: read the shards into the page cache in the background, with
# "Prefetching checkpoint files: N% (k/n)" progress); an older release's own parser refuses it in the verify stage
LOAD_STRATEGIES = ("lazy", "eager", "torchao", "prefetch")
LOADER_EXTRA_KEYS = {"enable_multithread_load": bool, "num_threads": int}

SPEC_METHODS = ("eagle3",)


class ServeConfigError(ValueError):
    """Bad deploy input; the message names the field, the value found and what is expected."""


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0].replace("_", "-") if arg.startswith("-") else ""


def speculative_config(method: str, model: str, num_speculative_tokens: int, extra: dict | None = None) -> str:
    """The ``--speculative-config`` JSON: compact, keys sorted, so equal configs render byte-identical."""
    if method not in SPEC_METHODS:
        raise ServeConfigError(f"speculative method: got {method!r}, expected one of {list(SPEC_METHODS)}")
    if not isinstance(num_speculative_tokens, int) or isinstance(num_speculative_tokens, bool) \
            or not 1 <= num_speculative_tokens <= 16:
        raise ServeConfigError(f"num_speculative_tokens: got {num_speculative_tokens!r}, expected an integer 1..16")
    if not model:
        raise ServeConfigError("speculative model (drafter path): empty")
    cfg: dict[str, Any] = dict(extra or {})
    cfg.update({"method": method, "model": model, "num_speculative_tokens": num_speculative_tokens})
    return json.dumps(cfg, sort_keys=True, separators=(",", ":"))


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
    """What every engine's argv needs, validated: launcher, model path, port, tensor-parallel size, served name."""
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
    name = spec.get("served_model_name") or ""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/:-]{0,127}", name):
        raise ServeConfigError(f"served_model_name: got {name!r}, expected 1-128 chars of [A-Za-z0-9._/:-]")
    return list(launcher), model, port, tp, name


def build_serve_argv(spec: dict) -> list[str]:
    """Validate ``spec`` and return the full argv, launcher first.

    ``spec`` keys: launcher (list), model, served_model_name, host, port,
    tensor_parallel_size, gpu_memory_utilization, max_model_len, max_num_seqs (null: vLLM's default),
    trust_remote_code, speculative ({method, model, num_speculative_tokens, extra}
    or None/{} for no speculation), safetensors_load_strategy ("" = vLLM's default),
    model_loader_extra_config (dict, {} = none), extra_args (list of str).
    """
    launcher, model, port, tp, name = common_fields(spec)
    gmu = spec.get("gpu_memory_utilization")
    if not isinstance(gmu, (int, float)) or isinstance(gmu, bool) or not 0 < float(gmu) <= 1:
        raise ServeConfigError(f"gpu_memory_utilization: got {gmu!r}, expected a number in (0, 1]")
    mml = spec.get("max_model_len")
    if mml is not None and (not isinstance(mml, int) or isinstance(mml, bool) or mml < 1):
        raise ServeConfigError(f"max_model_len: got {mml!r}, expected a positive integer or null")
    seqs = spec.get("max_num_seqs")
    if seqs is not None and (not isinstance(seqs, int) or isinstance(seqs, bool) or seqs < 1):
        raise ServeConfigError(f"max_num_seqs: got {seqs!r}, expected a positive integer or null")
    host = spec.get("host") or "0.0.0.0"
    strategy = spec.get("safetensors_load_strategy") or ""
    if strategy and strategy not in LOAD_STRATEGIES:
        raise ServeConfigError(f"safetensors_load_strategy: got {strategy!r}, expected one of {list(LOAD_STRATEGIES)} "
                               "or empty for vLLM's default")
    loader = spec.get("model_loader_extra_config") or {}
    if not isinstance(loader, dict):
        raise ServeConfigError(f"model_loader_extra_config: got {loader!r}, expected a mapping")
    for k, v in loader.items():
        want = LOADER_EXTRA_KEYS.get(k)
        if want is None or not isinstance(v, want) or (want is int and (isinstance(v, bool) or v < 1)):
            raise ServeConfigError(f"model_loader_extra_config: got {k}={v!r}, expected enable_multithread_load "
                                   "(true/false) and num_threads (a positive integer)")
    extra = check_extra_args(spec.get("extra_args") or [], MANAGED_FLAGS, "extra_args")

    argv = list(launcher) + ["serve", model,
                             "--served-model-name", name,
                             "--host", host,
                             "--port", str(port),
                             "--tensor-parallel-size", str(tp),
                             "--gpu-memory-utilization", _num(gmu)]
    if mml is not None:
        argv += ["--max-model-len", str(mml)]
    if seqs is not None:
        argv += ["--max-num-seqs", str(seqs)]
    if spec.get("trust_remote_code", True):
        argv.append("--trust-remote-code")
    sp = spec.get("speculative") or {}
    if sp:
        argv += ["--speculative-config",
                 speculative_config(sp.get("method", "eagle3"), sp.get("model", ""),
                                    sp.get("num_speculative_tokens", 3), sp.get("extra"))]
    if strategy:
        argv += ["--safetensors-load-strategy", strategy]
    if loader:
        argv += ["--model-loader-extra-config", json.dumps(loader, sort_keys=True, separators=(",", ":"))]
    argv += list(extra)
    return argv


def _num(x: float) -> str:
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


# A word that starts with this names a file in the unit's credentials directory (serve_sglang.CREDENTIALS_TOKEN):
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
