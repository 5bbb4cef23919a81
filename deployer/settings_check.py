"""Unknown setting names: a typo such as ``deployer_max_modl_len`` must not deploy the default silently.

The known names are read from the repository itself: every role's ``defaults/main.yml`` (the documented
settings) and every ``deployer_*`` / ``<role>_*`` name the playbooks use (switches the CLI passes, such as
``deployer_serial``).  A name with one of those prefixes that is not known is refused, with the closest
known names.  Other names (``ansible_user``, an operator's own variables) are not ours to judge.
"""
from __future__ import annotations

import difflib
import re
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Roles renamed (old prefix -> new), so that a setting of the old name is refused with its new one: the old prefix
# names no role any more, and an unknown name without a known prefix would pass unseen (2026-12: the install and
# patch stages lost the engine's name, as they serve SGLang too).
RENAMED_PREFIXES = {"vllm_install_": "install_", "vllm_patch_": "patch_"}


@lru_cache(maxsize=1)
def known() -> tuple[frozenset, tuple, tuple]:
    """(known names, prefixes, the documented settings: what a did-you-mean may suggest)."""
    import yaml
    roles = sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir())
    prefixes = tuple(sorted({"deployer_"} | {r + "_" for r in roles if r not in ("deployer", "stage")}
                            | set(RENAMED_PREFIXES)))
    names = set()
    for d in (ROOT / "roles").glob("*/defaults/main.yml"):
        names |= set((yaml.safe_load(d.read_text()) or {}).keys())
    documented = tuple(sorted(names))
    for d in (ROOT / "roles").glob("*/meta/inputs.yml"):
        names |= set((yaml.safe_load(d.read_text()) or {}).keys())
    rx = re.compile(r"\b(?:%s)\w+" % "|".join(re.escape(p) for p in prefixes))
    for f in list((ROOT / "playbooks").rglob("*.yml")) + list((ROOT / "roles").rglob("*.yml")):
        names |= set(rx.findall(f.read_text()))
    names.add("stage_name")
    return frozenset(names), prefixes, documented


def unknown(names) -> list[str]:
    """One message per unknown name: ``deployer_max_modl_len (did you mean deployer_max_model_len?)``."""
    ok, prefixes, documented = known()
    out = []
    for n in sorted(set(names)):
        if isinstance(n, str) and n.startswith(prefixes) and n not in ok:
            old = next((p for p in RENAMED_PREFIXES if n.startswith(p)), None)
            new = RENAMED_PREFIXES[old] + n[len(old):] if old else None
            if new in documented:
                out.append(f"{n} (renamed: {new})")
                continue
            close = difflib.get_close_matches(n, documented, n=2, cutoff=0.8)
            out.append(n + (f" (did you mean {' or '.join(close)}?)" if close else " (no such setting)"))
    return out


@lru_cache(maxsize=1)
def argument_specs() -> dict:
    """Every role's documented options (``meta/argument_specs.yml``, entry point ``main``), merged by name."""
    import yaml
    spec: dict = {}
    for f in sorted((ROOT / "roles").glob("*/meta/argument_specs.yml")):
        opts = ((yaml.safe_load(f.read_text()) or {}).get("argument_specs") or {}).get("main", {}).get("options")
        spec.update(opts or {})
    return spec


def invalid(values: dict) -> list[str]:
    """One message per value the roles' argument specs refuse (type, choices), checked by Ansible's own
    validator as the roles will check it, but naming the value given: ``deployer_gpu_memory_utilization:
    got 'lots' (str); ...``.  Names without a spec are not judged here."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
    spec = argument_specs()
    out = []
    for name in sorted(n for n in values if n in spec):
        one = {name: {k: v for k, v in spec[name].items() if k in ("type", "choices", "elements", "options")}}
        res = ArgumentSpecValidator(one).validate({name: values[name]})
        if res.error_messages:
            allowed = f"; allowed: {', '.join(map(repr, spec[name]['choices']))}" if spec[name].get("choices") else ""
            out.append(f"{name}: got {values[name]!r}; expected {spec[name].get('type', 'str')}{allowed}")
    return out


def _plain(msg: str) -> str:
    """Ansible's validator message without its internal class names."""
    return re.sub(r"<class '[\w.]*?(\w+)'>", lambda m: m.group(1).lstrip("_").replace("AnsibleTagged", "").lower(),
                  msg)


def explain_arg_spec_failure(msg: str) -> str:
    """A role's argument-spec failure (a value from the inventory or group_vars) in the deployer's words."""
    lines = [m for m in str(msg).splitlines()[1:] if m.strip()] or [str(msg)]
    return "bad setting value (before anything changed): " + "; ".join(_plain(m) for m in lines) + \
        " (settings and their types: roles/*/meta/argument_specs.yml)"
