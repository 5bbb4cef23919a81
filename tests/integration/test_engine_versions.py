"""The newest vLLM release the measured matrix covers (deployer/data/compatibility.json, bench/compat_matrix.py)
deploys and serves in the sandbox, verified by that release's own checks (issue 23): installed offline from the
cache scripts/dev.sh prepares, native (no patches), its argument parser and config validation run on the rendered
argv before the restart, its own supports_eagle3 answer in the journal, the smoke test through the API key."""
import json

import pytest

from deployer import versions
from helpers import CACHE, need
from sandbox_helpers import SVC, auth, flat, needs_sandbox, sandbox_hosts, sh, up, venv

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


def test_the_newest_measured_vllm_deploys_and_serves_verified_by_its_own_checks():
    need((CACHE / "venvs" / f"vllm-{NEWEST}" / ".deployer-installed").exists(),
         f"vLLM {NEWEST} (the matrix's newest) is prepared by scripts/dev.sh: the sandbox installs it offline")
    r = up("-e", f"deployer_vllm_version={NEWEST}", timeout=1500)
    assert r.returncode == 0, r.stdout + r.stderr
    err = flat(r.stdout + r.stderr)
    assert f"native support in vLLM {NEWEST}" in err, err
    assert f"vLLM {NEWEST} accepts this launch" in err, err        # its own parser and config validation
    rel = json.loads(sh(H, "cat /opt/deployer/current/release.json"))
    assert rel["vllm_version"] == NEWEST and rel["patches"] == [] and rel["venv"] == venv(NEWEST)
    assert f"supports_eagle3(KimiK25ForConditionalGeneration) = True (vLLM {NEWEST}" in sh(
        H, f"journalctl -u {SVC} --no-pager")
    assert rel["result"] == "live" and rel["acceptance_rate"] > 0, rel
    assert sh(H, "curl -s -o /dev/null -w '%{http_code}' " + auth() + " localhost:8000/v1/models") == "200"


@pytest.mark.skipif(not REFUSED_NEWER, reason="the matrix refuses no release newer than its newest supported one")
def test_a_newer_release_the_matrix_refuses_is_refused_before_anything_is_installed():
    """A release the matrix refuses (until 2026-12-04 vLLM 0.34.0, whose EAGLE proposer the patch engine did not
    recognise): the deploy stops at the plan, before a ~10 GB install, naming why; nothing on the host changes (the
    release the test above made stays live)."""
    v = REFUSED_NEWER[-1]
    before = (sh(H, "readlink /opt/deployer/current"), sh(H, "ls /opt/deployer/venvs"))
    r = up("-e", f"deployer_vllm_version={v}")
    assert r.returncode == 3, r.stdout + r.stderr        # a preflight refusal, as for any plan error
    assert f"vLLM {v} cannot serve Kimi-K2.5 with EAGLE-3 as measured from its own wheel" in flat(r.stderr), r.stderr
    assert (sh(H, "readlink /opt/deployer/current"), sh(H, "ls /opt/deployer/venvs")) == before
