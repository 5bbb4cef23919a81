"""Roles and modules follow their conventions; the playbook parses."""
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import ROOT

ROLES = sorted(p for p in (ROOT / "roles").iterdir() if p.is_dir())
WITH_DEFAULTS = [r for r in ROLES if (r / "defaults/main.yml").exists()]
# A role's own variables start with its prefix; deployer_* are the shared settings (deployer).
PREFIX = {r.name: ("deployer" if r.name == "deployer" else r.name) for r in ROLES}
MODULES = sorted((ROOT / "deployer/host/modules").glob("*.py"))
MODULES = [m for m in MODULES if m.name != "__init__.py"]
UNITS = ("_seconds", "_gib", "_mib", "_bytes")


def test_argument_specs_match_defaults():
    r = subprocess.run([sys.executable, str(ROOT / "scripts/gen_argument_specs.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_every_stage_setting_is_validated_when_the_run_starts():
    """The deployer role's spec (its validation is the first task of every playbook) holds every stage role's
    settings with their own type, default and choices: a wrong smoke_* value in an inventory is refused before the
    lock, not when the smoke starts after a 25-minute load; and a playbook that skips a stage role's own validation
    does so only for a role whose settings are there."""
    start = yaml.safe_load((ROOT / "roles/deployer/meta/argument_specs.yml").read_text())["argument_specs"]["main"]
    for role in WITH_DEFAULTS:
        if role.name in ("deployer", "balancer"):    # the balancer's settings are its own play's (balancer hosts)
            continue
        own = yaml.safe_load((role / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
        for name in yaml.safe_load((role / "defaults/main.yml").read_text()) or {}:
            got = start["options"].get(name)
            assert got is not None, f"{role.name}: {name} is not validated when the run starts"
            assert {k: got.get(k) for k in ("type", "default", "choices")} == \
                {k: own[name].get(k) for k in ("type", "default", "choices")}, name
    skipped = set(re.findall(r"name: (\w+)\n\s+rolespec_validate: false",
                             "".join(p.read_text() for p in (ROOT / "playbooks").rglob("*.yml"))))
    assert skipped and skipped <= {r.name for r in ROLES} - {"deployer", "balancer", "stage"}, skipped


@pytest.mark.parametrize("role", WITH_DEFAULTS, ids=lambda p: p.name)
def test_role_variables_are_prefixed_and_documented(role):
    text = (role / "defaults/main.yml").read_text()
    data = yaml.safe_load(text) or {}
    for name in data:
        assert name.startswith(PREFIX[role.name] + "_"), f"{role.name}: {name} not prefixed"
        i = text.index(f"\n{name}:")
        assert text[:i].rstrip().splitlines()[-1].lstrip().startswith("#"), f"{name} has no comment above it"
        if any(w in name for w in ("timeout", "budget", "delay", "disk", "memory")):
            assert name.endswith(UNITS + ("_utilization",)), f"{name}: say the unit in the name"


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.stem)
def test_module_docs(module):
    tree = ast.parse(module.read_text())
    consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
              for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)}
    doc = yaml.safe_load(consts["DOCUMENTATION"])
    assert doc["module"] == module.stem and doc["options"] and doc["attributes"]["check_mode"]["support"]
    assert yaml.safe_load(consts["EXAMPLES"]) and yaml.safe_load(consts["RETURN"])
    # an action-backed module (ansible-core's layout: the doc here, the code in action_plugins/) runs on the controller
    action = ROOT / "deployer/ansible_plugins/action_plugins" / module.name
    assert "supports_check_mode=True" in module.read_text() or (action.exists() and "def run(" in action.read_text())


def test_playbook_syntax():
    env = {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"}
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "--syntax-check",
                        "-i", str(ROOT / "inventory/example/hosts.yml"), str(ROOT / "playbooks/up.yml")],
                       capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def _filters_and_modules():
    names = {m.stem for m in MODULES}
    text = (ROOT / "deployer/ansible_plugins/filter_plugins/deployer_filters.py").read_text()
    names |= set(re.findall(r'"(\w+)": ', text))
    return names


@pytest.mark.parametrize("role", [r for r in ROLES if r.name not in ("deployer", "stage")], ids=lambda p: p.name)
def test_no_role_reads_another_roles_variables(role):
    """A role reads the shared settings (deployer_*), its own variables and the inputs the playbook wires in
    (meta/inputs.yml) - never another role's defaults, facts or registers, nor the old private _deployer_* facts."""
    others = [PREFIX[r.name] for r in ROLES if r.name not in (role.name, "deployer")]
    allowed = _filters_and_modules()
    files = list((role / "tasks").glob("*.yml"))
    if (role / "templates").exists():
        files += list((role / "templates").glob("*.j2"))
    bad = set()
    for f in files:
        # quoted words are strings (manifest keys), not variables
        for tok in re.findall(r"(?<![\w'\"])_{0,2}[a-z][a-z0-9_]*\b(?!['\"])", f.read_text()):
            name = tok.lstrip("_")
            if tok.startswith("_deployer_") or (name not in allowed and any(
                    name.startswith(p + "_") and not name.startswith(PREFIX[role.name] + "_") for p in others)):
                bad.add(f"{f.relative_to(ROOT)}: {tok}")
    assert not bad, sorted(bad)
