#!/usr/bin/env python3
"""Write roles/*/meta/argument_specs.yml from defaults/main.yml and meta/inputs.yml, and
roles/deployer/vars/main/settings.yml (``deployer_settings``: every ``deployer_*`` setting as deployer/plan.py takes
it) from the deployer role's defaults.

defaults/main.yml documents every setting of a role once (the comment above a variable is its
description; a ``# choices: a, b`` line adds choices).  meta/inputs.yml declares the role's required
inputs, the ones the playbook wires in from the plan (argument-spec options, hand-written: types,
required, descriptions).  This keeps the spec Ansible validates at run time in step with both, and a new setting
costs its default (with its comment) and the code that reads it;
tests/unit/test_roles.py fails when they drift.  Run: python3 scripts/gen_argument_specs.py
"""
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
# Roles whose argument spec is not generated (and so not validated at run time), with why.
UNVALIDATED = {
    "stage": "an internal dependency of every stage role whose one input each caller passes as a literal "
             "(meta/main.yml); validating it was a task of its own at every stage start, 12 per deploy",
}
TYPES = {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict"}


def parse(path):
    """(var, default, description) in file order; the description is the comment block above the var."""
    text = path.read_text()
    data = yaml.safe_load(text) or {}
    out, comments, head = [], [], None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#"):
            comments.append(s.lstrip("# ").rstrip())
        elif s and not line.startswith((" ", "-")) and ":" in s and not s.startswith("---"):
            name = s.split(":", 1)[0]
            choices = [c.split(":", 1)[1] for c in comments if c.startswith("choices:")]
            desc = " ".join(c for c in comments if c and not c.startswith("choices:")) or name.replace("_", " ")
            out.append((name, data[name], desc,
                        [x.strip() for x in choices[0].split(",")] if choices else None))
            comments = []
        elif not s:
            if head is None and not out and comments:
                head = " ".join(c for c in comments if c)  # the file's header block
            comments = []
    return head or "", out


class Dumper(yaml.SafeDumper):
    """Lists indented under their key, as yamllint (ansible-lint) expects."""

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)


def spec_for(role):
    head, vars_ = parse(role / "defaults/main.yml") if (role / "defaults/main.yml").exists() else ("", [])
    options = {}
    inputs = role / "meta/inputs.yml"
    if inputs.exists():
        options.update(yaml.safe_load(inputs.read_text()) or {})
    for name, default, desc, choices in vars_:
        options[name] = _setting_option(default, desc, choices)
    if role.name == "deployer":
        options.update(stage_settings())
    return {"argument_specs": {"main": {"short_description": head.split(":")[0] if head else role.name,
                                        "description": [head] if head else [], "options": options}}}


def _setting_option(default, desc, choices):
    t = TYPES.get(type(default), "raw")
    if isinstance(default, str) and "{{" in default:
        t = "str"
    opt = {"description": desc, "type": t, "default": default}
    if t == "list":
        opt["elements"] = "str" if not default or isinstance(default[0], str) else "raw"
    if choices:
        opt["choices"] = choices
    return opt


# Every stage role's settings are validated once, before the lock and before anything changes, by the deployer
# role's spec (the first task of every playbook): a wrong smoke_* or watch_* value would otherwise be found when its
# stage starts, after a 25-minute load.  The playbooks import the stage roles with rolespec_validate: false (their
# inputs are the plan's, made and checked by deployer/plan.py); each role's own spec stays whole for a role used
# alone.
def stage_settings():
    out = {}
    for role in sorted((ROOT / "roles").iterdir()):
        if (role.name in UNVALIDATED or role.name in ("deployer", "balancer")
                or not (role / "defaults/main.yml").exists()):
            continue
        for name, default, desc, choices in parse(role / "defaults/main.yml")[1]:
            out[name] = _setting_option(default, f"({role.name}) {desc}", choices)
    return out


FILTERS = {bool: " | bool", int: " | int", float: " | float"}     # the default's type, fixed on the way in


def settings_vars():
    """roles/deployer/vars/main/settings.yml: ``deployer_settings``, the ``deployer_*`` defaults without the prefix,
    each with its default's type (a bool, int or float given as a string becomes one; strings and secrets keep theirs).
    make_plan reads what it knows of it; release_plan the same."""
    _head, vars_ = parse(ROOT / "roles/deployer/defaults/main.yml")
    lines = ["---",
             "# Generated from defaults/main.yml by scripts/gen_argument_specs.py; edit the defaults.",
             "# The settings as deployer/plan.py:make_plan takes them (the deployer_ prefix dropped, each with its",
             "# default's type).  Not a setting: derived from the defaults, evaluated where it is used.  The caller",
             "# binds the plan to the NVIDIA device classes the host measured (plan.with_devices).",
             "deployer_settings:"]
    for name, default, _desc, _choices in vars_:
        if name.startswith("deployer_"):
            lines.append(f'  {name[len("deployer_"):]}: "{{{{ {name}{FILTERS.get(type(default), "")} }}}}"')
    # the install role's package pins name the venv (plan.py): a changed pin is a new venv, never the live one
    # reinstalled; set in the inventory or not at all (the install role's defaults are [] and out of scope here)
    lines.append('  install_packages: "{{ (install_overrides | default([])) + (install_extra_packages | default([]))'
                 ' }}"')
    # the preflight's GPU health settings also make the gate before every start of the engine (plan.py gpu_gate)
    lines.append('  gpu_gate: "{{ preflight_gpu_health | default(true) | bool }}"')
    lines.append('  gpu_health_since_epoch: "{{ preflight_gpu_health_since_epoch | default(0) | int }}"')
    return "\n".join(lines) + "\n"


def main(check=False):
    bad = []
    path = ROOT / "roles/deployer/vars/main/settings.yml"
    if check and path.read_text() != settings_vars():
        bad.append(str(path.relative_to(ROOT)))
    elif not check:
        path.write_text(settings_vars())
    for role in sorted((ROOT / "roles").iterdir()):
        if role.name in UNVALIDATED or (not (role / "defaults/main.yml").exists()
                                        and not (role / "meta/inputs.yml").exists()):
            continue
        want = "---\n# Generated from defaults/main.yml by scripts/gen_argument_specs.py; edit the defaults.\n" + \
            yaml.dump(spec_for(role), Dumper=Dumper, sort_keys=False, width=110)
        path = role / "meta/argument_specs.yml"
        if check:
            if not path.exists() or path.read_text() != want:
                bad.append(str(path.relative_to(ROOT)))
        else:
            path.parent.mkdir(exist_ok=True)
            path.write_text(want)
    if bad:
        print("out of date:", ", ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(check="--check" in sys.argv))
