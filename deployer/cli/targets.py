"""Where a command acts (the target options, defined once) and the extra variables it passes."""
from __future__ import annotations

import atexit
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, NoReturn, Optional

import typer
import yaml

from deployer.events import Exit
from deployer.output import err, lit
from deployer.runner import SECRET_ENV

# Secret settings: never stored in schedules, never printed; also settable from the environment.

Host = Annotated[Optional[str],
                 typer.Option("--host", help="Host address (ad-hoc inventory of one host, root over SSH).")]
Port = Annotated[int, typer.Option("--port", help="SSH port.")]
User = Annotated[str, typer.Option("--user", help="SSH user.")]
Key = Annotated[Optional[str], typer.Option("--key", help="SSH private key file.")]
Inventory = Annotated[Optional[str], typer.Option("-i", "--inventory", help="Ansible inventory (with group_vars).")]
Sandbox = Annotated[bool, typer.Option("--sandbox", help="The embedded sandbox host(s).")]
Limit = Annotated[Optional[str], typer.Option("--limit", help="Ansible host pattern.")]
TrustNew = Annotated[bool, typer.Option("--trust-new-host", help="Record an unknown host's SSH key on first contact "
                                                                  "(a changed key is still refused).")]
Extra = Annotated[Optional[list[str]], typer.Option("-e", "--extra-vars", help="key=value or @file.yml (repeatable).")]
Json = Annotated[bool, typer.Option("--json", help="JSON lines on stdout instead of human output.")]
Serial = Annotated[int, typer.Option("--serial", help="Rolling: N hosts at a time, stop at the first failure (behind a "
                                                      "balancer, fewer than all: a host must keep serving).")]


def die(code: Exit, msg: str) -> NoReturn:
    err.print(f"[bold red]error:[/] {lit(msg, block=True)}")
    raise typer.Exit(int(code))


@dataclass
class Target:
    host: Optional[str] = None
    port: int = 22
    user: str = "root"
    key: Optional[str] = None
    inventory: Optional[str] = None
    sandbox: bool = False
    limit: Optional[str] = None
    trust_new: bool = False

    def inventory_path(self) -> str:
        """The inventory to run against: exactly one of --host, -i or --sandbox."""
        if sum(bool(x) for x in (self.host, self.inventory, self.sandbox)) != 1:
            die(Exit.USAGE, "say where to deploy: exactly one of --host ADDR, -i INVENTORY or --sandbox")
        if self.sandbox:
            from deployer.sandbox import hosts as sb
            if not any(s["running"] for s in sb.status()):
                err.print("sandbox: starting 1 host ...")
                sb.start(1)
            return str(sb.STATE / "inventory.yml")
        if self.inventory:
            if not Path(self.inventory).exists():
                die(Exit.USAGE, f"inventory {self.inventory}: no such file")
            check_inventory_file(Path(self.inventory))
            return self.inventory
        return adhoc_inventory(self.host, self.port, self.user, self.key, self.trust_new)

    def schedule_words(self) -> list[str]:
        """The target as `deployer up` options, for a schedule."""
        if sum(bool(x) for x in (self.host, self.inventory, self.sandbox)) != 1:
            die(Exit.USAGE, "say where to deploy: exactly one of --host, -i or --sandbox")
        if self.host:
            # a scheduled run starts in / : a relative key path would name another file
            return ["--host", self.host, "--port", str(self.port), "--user", self.user] + \
                (["--key", str(Path(self.key).expanduser().resolve())] if self.key else [])
        if self.inventory:
            return ["-i", str(Path(self.inventory).resolve())]
        return ["--sandbox"]


def check_inventory_file(path: Path) -> None:
    """A YAML/JSON inventory that does not parse is bad input, said as such: Ansible would only warn and go on
    with no hosts (INI files, directories and scripts are left to Ansible)."""
    if path.is_dir() or path.suffix not in (".yml", ".yaml", ".json"):
        return
    class Loader(yaml.SafeLoader):   # Ansible's own tags (!vault, !unsafe) are valid in an inventory
        pass
    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    try:
        data = yaml.load(path.read_text(), Loader=Loader)  # noqa: S506 - a SafeLoader that ignores tags
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        die(Exit.USAGE, f"inventory {path}: cannot be read as YAML: {' '.join(str(e).split())}")
    if not isinstance(data, dict):
        die(Exit.USAGE, f"inventory {path}: expected a mapping of groups (e.g. all: {{children: {{gpu: ...}}}}), "
                        f"got {type(data).__name__}")


def adhoc_inventory(host: str, port: int, user: str, key: Optional[str], trust_new: bool = False) -> str:
    """An inventory of one host in a private temp file, deleted when the command ends."""
    h: dict = {"ansible_host": host, "ansible_port": port, "ansible_user": user}
    if user != "root":   # the deploy needs root on the host: a login user becomes root with (passwordless) sudo
        h["ansible_become"] = True
    if trust_new:  # trust on first use: record an unknown host's key, still refuse a changed one
        h["ansible_ssh_common_args"] = "-o StrictHostKeyChecking=accept-new"
    if key:
        h["ansible_ssh_private_key_file"] = key
    fd, path = tempfile.mkstemp(prefix="deployer-inv-", suffix=".yml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump({"all": {"children": {"gpu": {"hosts": {host: h}}}}}, f)
    atexit.register(lambda: Path(path).unlink(missing_ok=True))
    return path


def _yaml_problem(e: Exception) -> str:
    """YAML's complaint without its quote of the text (which may hold a secret): what and where."""
    mark = getattr(e, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    context = f"{e.context}: " if getattr(e, "context", None) else ""
    return f"{context}{getattr(e, 'problem', None) or type(e).__name__}{where}"


def parse_extra(extra: list[str], from_env: bool = True) -> dict:
    """``-e k=v`` (value parsed as YAML, except for a setting of type str: kept as typed), ``-e @file.yml`` or, as
    ansible-playbook takes it, ``-e '{"k": [..]}'`` (a JSON/YAML mapping); secrets also from DEPLOYER_API_KEY /
    _HF_TOKEN.  A secret or other str setting never changes type on the way in: ``-e deployer_api_key=0777``
    stays "0777" (YAML 1.1 would make it 511, ``1:30`` 90), and a non-string one from a mapping is refused."""
    from deployer.settings_check import argument_specs, invalid, unknown
    spec = argument_specs()

    def is_str_setting(k: str) -> bool:
        return k in SECRET_ENV or (spec.get(k) or {}).get("type", "str") == "str" and k in spec

    vals: dict = {}
    for n, item in enumerate(extra, 1):
        # an item is never echoed (a secret may be in it); a file is named by its path
        shown = f"@{item[1:]}" if item.startswith("@") else f"item {n} (a mapping)"
        if item.startswith("@") or item.lstrip().startswith("{"):
            try:
                loaded = yaml.safe_load(item if item.lstrip().startswith("{") else Path(item[1:]).read_text()) or {}
            except OSError as e:
                die(Exit.USAGE, f"-e {shown}: {e.strerror or e}")
            except (yaml.YAMLError, UnicodeDecodeError) as e:
                die(Exit.USAGE, f"-e {shown}: not a valid YAML/JSON mapping: {_yaml_problem(e)}; "
                                "its text is not shown (it may hold a secret)")
            if not isinstance(loaded, dict):
                die(Exit.USAGE, f"-e {shown}: expected a mapping of variables, got {type(loaded).__name__}")
            for k, v in loaded.items():
                if isinstance(k, str) and is_str_setting(k) and v is not None and not isinstance(v, str):
                    shown = "..." if k in SECRET_ENV else repr(v)
                    die(Exit.USAGE, f"-e {k}: got {shown} ({type(v).__name__}), expected a string: quote it "
                                    f"(YAML reads 0777 as the integer 511 and 1:30 as 90)")
            vals.update(loaded)
            continue
        if "=" not in item:
            die(Exit.USAGE, f"-e item {n}: expected key=value or @file.yml (the item is not shown: it may hold a "
                            "secret)")
        k, v = item.split("=", 1)
        if is_str_setting(k):
            vals[k] = v
            continue
        try:
            vals[k] = yaml.safe_load(v) if v else ""
        except yaml.YAMLError:
            vals[k] = v
        if vals[k] is None:  # "-e k=null" or "-e k=~": an empty value
            vals[k] = ""
    bad = unknown(vals)
    if bad:
        die(Exit.USAGE, "unknown setting: " + "; ".join(bad) + " (settings: roles/*/defaults/main.yml)")
    bad = invalid(vals)
    if bad:
        die(Exit.USAGE, "bad setting value: " + "; ".join(bad) + " (types: roles/*/meta/argument_specs.yml)")
    for var, env in SECRET_ENV.items():
        if from_env and os.environ.get(env) and var not in vals:
            vals[var] = os.environ[env]
        if isinstance(vals.get(var), str):
            refuse_control_in_secret(var, vals[var], env)
    return vals


def refuse_control_in_secret(var: str, value: str, env: str) -> None:
    """A secret holding a control character (the line end a YAML ``|`` block or a CRLF key file leaves) would end
    its env-file line: refused here, before any playbook, naming the setting and the character only."""
    from deployer.host.module_utils.formats import control_char
    bad = control_char(value)
    if bad:
        die(Exit.USAGE, f"{var} (or {env}) contains the control character {bad}: a line end from a YAML '|' block "
                        f"or a key file? remove it (the value is not shown)")
