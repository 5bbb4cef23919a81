"""A vLLM release newer than the measured matrix's newest supported one (deployer/data/compatibility.json,
bench/compat_matrix.py) is refused by the plan before anything is installed (issue 23).

That the newest measured release (0.33.0) deploys verified by its own checks was held here by a stand-in deploy of
it (~140 s: an offline install of its ~10 GB venv and its checks on the host).  Since the sandbox serves the real
engine, that job is the real vLLM's, end to end: tests/integration/test_real_engine.py (vLLM 0.32's CPU build,
installed offline, verified by its own parser and config validation on the host, serving Kimi-K2.5's own class);
0.33.0's own checks on the rendered argv run in tests/vllm/test_real_venv.py."""

import pytest

from deployer import versions
from sandbox_helpers import flat, needs_sandbox, sandbox_hosts, sh, up

pytestmark = [pytest.mark.sandbox, needs_sandbox]
H = "sbx1"
ROWS = [r for r in versions.load()["rows"] if r["engine"] == "vLLM"]
# the newest release the matrix supports and the package index can install (vLLM 0.34.0 pins a flashinfer-python
# the index lacks: docs/compatibility.md, "installs"); a newer one it refuses is refused by the plan: the last test
NEWEST = max((r["version"] for r in ROWS if versions.verdict(r)[0] != "refused" and r.get("install", "ok") == "ok"),
             key=versions.vtuple)
REFUSED_NEWER = sorted((r["version"] for r in ROWS if versions.verdict(r)[0] == "refused"
                        and versions.vtuple(r["version"]) > versions.vtuple(NEWEST)), key=versions.vtuple)


@pytest.fixture(scope="module", autouse=True)
def sandbox():
    yield from sandbox_hosts(1)


@pytest.mark.skipif(not REFUSED_NEWER, reason="the matrix refuses no release newer than its newest supported one")
def test_a_newer_release_the_matrix_refuses_is_refused_before_anything_is_installed():
    """A release the matrix refuses (until 2026-12-04 vLLM 0.34.0, whose EAGLE proposer the patch engine did not
    recognise): the deploy stops at the plan, before a ~10 GB install, naming why; nothing on the host changes (the
    release live before, if any, stays live)."""
    v = REFUSED_NEWER[-1]
    before = (sh(H, "readlink /opt/deployer/current || true"), sh(H, "ls /opt/deployer/venvs || true"))
    r = up("-e", f"deployer_vllm_version={v}")
    assert r.returncode == 3, r.stdout + r.stderr        # a preflight refusal, as for any plan error
    assert f"vLLM {v} cannot serve Kimi-K2.5 with EAGLE-3 as measured from its own wheel" in flat(r.stderr), r.stderr
    assert (sh(H, "readlink /opt/deployer/current || true"), sh(H, "ls /opt/deployer/venvs || true")) == before
