"""Does EAGLE-3 pay: a release's smoke tokens/s against the host's own release served the other way
(deployer/host/module_utils/spec_payoff.py), recorded by release_flip, shown by `deployer up` and
`deployer releases`."""
import json

from deployer import events
from deployer.cli import deploy, views
from deployer.host.module_utils import releases as r
from deployer.host.module_utils.spec_payoff import compare, describe

MODEL = "/srv/models/kimi-k2.5"


def rel(i, spec, tps, at, tau=None, backend="vllm", model=MODEL):
    return {"id": i, "speculative": spec, "tokens_per_second": tps, "deployed_at": at, "backend": backend,
            "model_dir": model, "mean_acceptance_length": tau}


def test_slower_speculation_is_named_with_its_break_even():
    plain = rel("plain1", False, 40.0, 100)
    spec = rel("spec1", True, 32.0, 200, tau=2.4)
    p = compare(spec, [plain, spec])
    assert p == {"speculative_release": "spec1", "plain_release": "plain1", "speculative_tokens_per_second": 32.0,
                 "plain_tokens_per_second": 40.0, "speedup": 0.8, "pays": False, "mean_acceptance_length": 2.4,
                 # a verify step: 2.4 tokens in 75 ms; a plain step: 1 token in 25 ms -> it needs 3.0 per step
                 "step_ms": 75.0, "plain_step_ms": 25.0, "break_even_acceptance_length": 3.0}
    line = describe(p)
    assert "EAGLE-3 x0.80 (32.0 tokens/s, release spec1) against no speculation (40.0 tokens/s, release plain1)" in line
    assert "SLOWER than no speculation" in line and "break-even at a mean acceptance length of 3.0" in line


def test_the_plain_release_is_compared_the_same_way_round():
    spec = rel("spec1", True, 60.0, 100, tau=2.5)
    plain = rel("plain1", False, 40.0, 200)
    p = compare(plain, [spec])
    assert (p["speculative_release"], p["plain_release"], p["speedup"], p["pays"]) == ("spec1", "plain1", 1.5, True)
    assert p["break_even_acceptance_length"] == round(2.5 / 1.5, 2)


def test_only_the_same_engine_and_model_served_the_other_way_and_measured_counts():
    spec = rel("spec2", True, 30.0, 500, tau=2.0)
    others = [rel("sglang", False, 90.0, 400, backend="sglang"),      # another engine
              rel("othermodel", False, 90.0, 401, model="/srv/models/other"),
              rel("spec1", True, 90.0, 402, tau=3.0),                 # the same way
              rel("failed", False, None, 403),                         # never measured (its smoke failed)
              rel("old", False, 20.0, 100), rel("newer", False, 25.0, 300)]
    p = compare(spec, others)
    assert p["plain_release"] == "newer" and p["speedup"] == 1.2       # the newest measured plain release
    assert compare(spec, others[:4]) is None                           # nothing comparable
    assert compare(rel("x", True, None, 1), others) is None            # this release measured nothing
    assert compare(dict(spec, speculative=None), others) is None       # recorded before the flag was kept


def test_an_unmeasured_gain_says_how_to_measure_it():
    assert "-e deployer_speculative_enabled=false measures it" in describe(None, True)
    assert "-e deployer_speculative_enabled=true measures it" in describe(None, False)


def test_release_flip_records_the_payoff_where_the_release_is_kept(tmp_path):
    """The module's own steps (read_releases / compare / record) on a real release store: the
    payoff is written into the new release's manifest, so pruning the baseline later loses nothing."""
    root = tmp_path / "releases"
    for rid, spec, tps, at in (("plain1", False, 40.0, 100), ("spec1", True, None, None)):
        (root / rid).mkdir(parents=True)
        (root / rid / "release.json").write_text(json.dumps(
            {"id": rid, "backend": "vllm", "model_dir": MODEL, "speculative": spec, "tokens_per_second": tps,
             "deployed_at": at}))
    facts = {"tokens_per_second": 50.0, "mean_acceptance_length": 2.5}
    others = r.read_releases(str(root))
    p = compare(dict(next(x for x in others if x["id"] == "spec1"), **facts), others)
    r.record(str(root / "spec1"), "live", dict(facts, speculation_payoff=p))
    state = r.host_state(str(tmp_path), "vllm")
    got = {x["id"]: x for x in state["releases"]}["spec1"]
    assert got["speculative"] is True and got["speculation_payoff"]["speedup"] == 1.25
    assert views._gain(got["speculation_payoff"]) == "x1.25"
    assert views._gain(dict(p, speedup=0.8, pays=False)) == "x0.80 slower"
    assert views._gain(None) == "-"


def result(facts):
    return events.Result(rc=0, status="successful", failures=[], stats={"processed": {"h1": 1}}, facts=facts)


def test_up_warns_when_speculation_is_slower(capsys):
    base = {"outcome": "ok", "exit_class": "ok", "release": "spec1", "release_was_live": False, "restarted": True,
            "acceptance_rate": 0.45, "mean_acceptance_length": 2.4, "tokens_per_second": 32.0, "speculative": True}
    slow = compare(rel("spec1", True, 32.0, 200, tau=2.4), [rel("plain1", False, 40.0, 100)])
    assert deploy.report(result({"h1": {"deployer_result": dict(base, speculation_payoff=slow)}}), False, "up") == 0
    said = capsys.readouterr()
    err = " ".join(said.err.split())
    assert "warning: h1: EAGLE-3 x0.80" in err and "SLOWER than no speculation" in err
    assert "-e deployer_speculative_enabled=false serves without it" in err
    # no baseline: an informational line, not a warning; the exit code is the deploy's (0)
    assert deploy.report(result({"h1": {"deployer_result": base}}), False, "up") == 0
    said = capsys.readouterr()
    assert "warning" not in said.err and "EAGLE-3's gain is unmeasured" in " ".join(said.out.split())
    # nothing restarted: nothing measured, nothing said
    assert deploy.report(result({"h1": {"deployer_result": dict(base, restarted=False, release_was_live=True)}}),
                         False, "up") == 0
    assert "EAGLE-3's gain" not in capsys.readouterr().out
