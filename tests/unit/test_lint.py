"""The field's own quality gates, run as tests so CI enforces them:

* ruff (config in pyproject.toml) over the Python tree: a NameError in a rarely taken branch (the lock
  report) once reached a clean-clone CI run before any test saw it;
* ``ansible-test sanity --test validate-modules`` on the custom modules, in a throwaway collection
  layout (ansible-test only runs inside ``ansible_collections/<ns>/<name>``);
* ansible-lint, production profile, over playbooks/ and roles/ (skips and their reasons: .ansible-lint).
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import ROOT

BIN = Path(sys.executable).parent
# Modules of this project are not part of Ansible itself: the GPLv3 header rule is for ansible-core's own.
SANITY_IGNORES = ["validate-modules:missing-gplv3-license"]


def scrubbed_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "PYTHON"))}
    env["PATH"] = os.pathsep.join([str(BIN), "/usr/local/bin", "/usr/bin", "/bin"])
    env.update(extra)
    return env


def test_ruff():
    r = subprocess.run([str(BIN / "ruff"), "check", "--quiet", "deployer", "tests", "bench", "scripts"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def _project_names_used(path):
    """(line, module, name) for every ``deployer.*`` name ``path`` imports or reads off an imported module."""
    import ast
    import importlib
    tree, aliases, used = ast.parse(path.read_text()), {}, []
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "deployer":
            for a in n.names:
                try:
                    aliases[a.asname or a.name] = importlib.import_module(f"{n.module}.{a.name}")
                except ModuleNotFoundError:       # a name, not a submodule (or a module Ansible loads its own way)
                    used.append((n.lineno, n.module, a.name))
        elif isinstance(n, ast.Import):
            aliases.update({a.asname: importlib.import_module(a.name) for a in n.names
                            if a.asname and a.name.split(".")[0] == "deployer"})
    used += [(n.lineno, aliases[n.value.id].__name__, n.attr) for n in ast.walk(tree)
             if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in aliases]
    return used


def test_every_project_name_a_module_uses_exists():
    # ruff sees undefined local names, not a name read off another module: moving is_balancer and STANDIN_PATH out
    # of sandbox/hosts.py (when it was split) left two sandbox test helpers reading them there - found only by the
    # 25-minute suite.  This finds it in a second, for the tests, benchmarks and scripts the unit tests never run.
    import importlib
    missing = []
    for path in sorted(p for d in ("deployer", "tests", "bench", "scripts") for p in (ROOT / d).rglob("*.py")):
        for line, module, name in _project_names_used(path):
            try:
                mod = importlib.import_module(module)
            except ModuleNotFoundError:           # an Ansible module (its module_utils import only under Ansible)
                continue
            if not hasattr(mod, name) and not (Path(mod.__file__).parent / f"{name}.py").exists():
                missing.append(f"{path.relative_to(ROOT)}:{line}: {module} has no {name}")
    assert not missing, "\n".join(missing)


def test_validate_modules(tmp_path):
    col = tmp_path / "ansible_collections" / "deployer" / "tools"
    mods, utils = col / "plugins" / "modules", col / "plugins" / "module_utils"
    for src, dst in ((ROOT / "deployer/host/modules", mods),
                     (ROOT / "deployer/host/module_utils", utils)):
        dst.mkdir(parents=True)
        for f in src.glob("*.py"):
            if f.name == "__init__.py":
                continue
            text = f.read_text()
            # ansible.module_utils.<ours> is how ansible.cfg's module_utils path is imported; in a collection
            # the same code is ansible_collections.<ns>.<name>.plugins.module_utils.<ours>
            text = re.sub(r"from ansible\.module_utils\.(?!basic\b|urls\b)(\w+) import",
                          r"from ansible_collections.deployer.tools.plugins.module_utils.\1 import", text)
            (dst / f.name).write_text(text)
    (col / "galaxy.yml").write_text("namespace: deployer\nname: tools\nversion: 0.1.0\nreadme: README.md\n"
                                    "authors: [deployer maintainers]\n")
    (col / "README.md").write_text("throwaway layout for ansible-test\n")
    ign = col / "tests" / "sanity" / "ignore-2.19.txt"
    ign.parent.mkdir(parents=True)
    ign.write_text("".join(f"plugins/modules/{m.name} {rule}\n" for m in sorted(mods.glob("*.py"))
                           for rule in SANITY_IGNORES))
    cache = Path.home() / ".ansible" / "test" / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    for v in ("24_2", "25_0", "25_1", "25_2", "25_3"):   # whichever pip version this ansible-test bootstraps
        shutil.copy(ROOT / "tests/sanity/get_pip_offline.py", cache / f"get_pip_{v}.py")
    r = subprocess.run([str(BIN / "ansible-test"), "sanity", "--test", "validate-modules", "--python", "3.11"],
                       capture_output=True, text=True, cwd=col, env=scrubbed_env(), timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


def test_ansible_lint_production_profile():
    r = subprocess.run([str(BIN / "ansible-lint"), "--profile", "production", "--nocolor", "-q", "playbooks", "roles"],
                       capture_output=True, text=True, cwd=ROOT, env=scrubbed_env(), timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
