"""Pyflakes rules (undefined names, unused imports) over the whole tree: a NameError in a rarely taken
branch (the lock report) once reached a clean-clone CI run before any test saw it."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT


def test_no_undefined_names_or_unused_imports():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff not installed (pip install -e .[test])")
    r = subprocess.run([ruff, "check", "--select", "F", "--quiet", "deployer", "tests", "bench", "scripts"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
