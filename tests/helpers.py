import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "deployer"

# `scripts/dev.sh test` (what CI runs) sets this: everything its set-up prepares must be there, so a missing
# prerequisite (a prepared venv, root, systemd-nspawn, haproxy) fails the run instead of quietly skipping the tests
# that need it (issue 24).  Run by hand without it, such tests skip with the reason.
STRICT = os.environ.get("DEPLOYER_TEST_STRICT") == "1"


def need(ok, why):
    """Skip (or, under STRICT, fail) the calling test when ``ok`` is false."""
    if not ok:
        import pytest
        (pytest.fail if STRICT else pytest.skip)(why)
