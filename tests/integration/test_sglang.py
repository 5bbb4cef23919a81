"""SGLang as the second backend (issue #14), on one sandbox host with real systemd and the real SGLang 0.5.23
installed in the release venv (its own parser, server-args resolution and Kimi-K2.5 class answer the checks;
the stand-in plays the GPU work).  Each test fails on a build without the property it names."""
import json

import pytest

from sandbox_helpers import FAST, SVC, deployer, flat, main_pid, needs_sandbox, sandbox_hosts, sh, up

pytestmark = [pytest.mark.sandbox, needs_sandbox]
H = "sbx1"
SG = ["-e", "deployer_backend=sglang"]
SG_VENV = "/opt/deployer/venvs/sglang-0.5.23"


@pytest.fixture(scope="module", autouse=True)
def sandbox():
    yield from sandbox_hosts(1, engines=("sglang-0.5.23",))


def manifest(rel="current"):
    return json.loads(sh(H, f"cat /opt/deployer/{rel}/release.json"))


def test_01_sglang_serves_with_eagle3_verified_by_sglang_itself(sandbox):
    # SGLang's /health generates a token once the server is up (>= 1 s; 3 s here, past the 2 s vLLM's needs): the
    # watch must wait for it, not count it unanswered until the budget ends; the acceptance floor must read
    # SGLang's counters (its gauges stay 0 for a short request on a fresh server)
    sandbox.set_knobs(H, standin={"phase_seconds": {"weights": 6}, "health_generate_seconds": 3})
    try:
        r = up(*SG, "-e", "smoke_min_acceptance_rate=0.5", "-e", "watch_budget_seconds=600")
    finally:
        sandbox.set_knobs(H, standin={})
    assert r.returncode == 0, r.stdout + r.stderr
    m = manifest()
    assert m["backend"] == "sglang" and m["engine_version"] == "0.5.23" and m["venv"] == SG_VENV
    # the launch: SGLang's flags, EAGLE-3 chain of 3 (+1 verified), triton attention for target and drafter
    argv = m["argv"]
    assert argv[:3] == [f"{SG_VENV}/bin/python", "/usr/local/lib/deployer-sandbox/vllm_standin.py", "serve"]
    for flag, value in (("--speculative-algorithm", "EAGLE3"), ("--speculative-num-steps", "3"),
                        ("--speculative-num-draft-tokens", "4"), ("--attention-backend", "triton"),
                        ("--speculative-draft-attention-backend", "triton"), ("--tp-size", "8"),
                        ("--tool-call-parser", "kimi_k2")):
        assert argv[argv.index(flag) + 1] == value, (flag, argv)
    assert "--enable-metrics" in argv
    # verified before the restart by the real SGLang: its parser, its resolution, the hook on the outer class
    out = r.stdout + r.stderr
    assert "SGLang 0.5.23 accepts this launch: sglang_argparse, sglang_server_args, eagle3_hook" in out
    assert "KimiK25ForConditionalGeneration with set_eagle3_layers_to_capture" in out
    # acceptance from SGLang's counters (tokens, requests, verify steps), in the same fields as vLLM's: one short
    # smoke request on a fresh server leaves its gauges at 0 (set every 40 decode steps); the stand-in's verify
    # steps are whole, so the measured rate is near the knob's 0.6, not equal to it
    assert m["acceptance_rate"] == pytest.approx(0.6, abs=0.1) and m["mean_acceptance_length"] == pytest.approx(
        2.8, abs=0.3), m
    gauges = sh(H, "curl -s localhost:8000/metrics | grep -E '^sglang:spec_accept_(rate|length)'")
    assert all(line.endswith(" 0.0") for line in gauges.splitlines()), gauges
    # the API key reaches SGLang through systemd's credentials, never argv (world-readable) or the journal
    assert "--api-key" not in argv and argv[-2:] == ["--config", "{credentials}/sglang-secrets.yaml"]
    unit = sh(H, f"cat /etc/systemd/system/{SVC}.service")
    # ... from the live secrets, outside every release (a rollback never brings an old key back: docs/security.md)
    assert "LoadCredential=sglang-secrets.yaml:/opt/deployer/secrets/sglang-secrets.yaml" in unit
    assert '"--config" "%d/sglang-secrets.yaml"' in unit
    assert sh(H, "stat -c '%a %U' /opt/deployer/secrets/sglang-secrets.yaml /opt/deployer/secrets") == \
        "600 root\n700 root"
    assert sh(H, f"ls /opt/deployer/releases/{m['id']}/") .count("sglang-secrets") == 0
    assert "VLLM_API_KEY" not in sh(H, "cat /opt/deployer/current/vllm.env")
    from deployer.sandbox.inventory import api_key
    key = api_key()
    assert key not in sh(H, f"ps -eo args; journalctl -u {SVC} --no-pager")
    # the key works and is needed (the stand-in read it from the --config file systemd handed over)
    assert sh(H, "curl -s -o /dev/null -w '%{http_code}' localhost:8000/v1/models") == "401"
    # the load phases came from SGLang's log lines
    assert {"weights", "kv_cache", "graphs", "api"} <= set(m["phase_seconds"])
    assert sh(H, "systemctl show -p ActiveState --value " + SVC) == "active"
    # SGLang's shard bar redraws with \r only: under journal_lines.py each redraw is its own journal entry, written
    # as it happens (spread over the 6 s of the load), not one entry when the bar closes (issue #11 point 1)
    stamps = [float(x.split()[0]) for x in sh(H, (
        f"journalctl _SYSTEMD_INVOCATION_ID=$(systemctl show -p InvocationID --value {SVC}) -o short-unix "
        "--no-pager --all | grep 'Loading safetensors checkpoint shards: *[0-9]*% Completed | [0-9]*/64' || true"
    )).splitlines()]
    assert len(stamps) >= 10 and max(stamps) - min(stamps) >= 3.0, stamps


def test_02_vllm_sglang_vllm_by_up_and_rollback():
    r = up(*FAST)                                   # vLLM, the default backend
    assert r.returncode == 0, r.stdout + r.stderr
    vllm_id = manifest()["id"]
    assert manifest()["backend"] == "vllm"
    # back to the SGLang release, with an acceptance floor: the rollback's plan has SGLang's drafts per verify step
    # (its acceptance comes from the counters, as on the way up; the gauges of the fresh server still read 0)
    r = deployer("rollback", "--sandbox", "-e", "smoke_min_acceptance_rate=0.5")
    assert r.returncode == 0, r.stdout + r.stderr
    assert manifest()["backend"] == "sglang" and manifest("previous")["id"] == vllm_id
    assert "--model-path" in json.loads(sh(H, "cat /run/deployer-standin/argv.json"))["argv"]
    r = deployer("rollback", "--sandbox")           # and to vLLM again
    assert r.returncode == 0, r.stdout + r.stderr
    assert manifest()["id"] == vllm_id and manifest("previous")["backend"] == "sglang"
    assert "--speculative-config" in json.loads(sh(H, "cat /run/deployer-standin/argv.json"))["argv"]
    r = deployer("releases", "--sandbox")
    assert "sglang 0.5.23" in r.stdout and "vllm 0.16.0" in r.stdout, r.stdout


@pytest.mark.parametrize("args, said, stage", [
    # a misspelt flag: SGLang's own argparse message, from the verify stage
    (["-e", '{"deployer_sglang_extra_args": ["--speculative-num-drafts", "4"]}'],
     "unrecognized arguments: --speculative-num-drafts", "verify"),
    # an abbreviation argparse would take for a flag the deployer owns
    (["-e", '{"deployer_sglang_extra_args": ["--speculative-num-draft", "8"]}'],
     "--speculative-num-draft abbreviates --speculative-num-draft-tokens", "preflight"),
    # an attention backend that crashes on sm_120 although SGLang's own checks accept it
    (["-e", "deployer_sglang_attention_backend=trtllm_mla"],
     "--attention-backend trtllm_mla: prefill crashes with 'Unsupported architecture' on sm_120", "preflight"),
    # an SGLang without Kimi-K2.5
    (["-e", "deployer_sglang_version=0.5.8"], "SGLang 0.5.8 has no Kimi-K2.5 model class", "preflight"),
    # a CUDA_HOME without nvcc: FlashInfer's JIT would fail at SGLang's first kernel, after the load (issue 42)
    (["-e", '{"deployer_env_extra": {"CUDA_HOME": "/opt/no-cuda"}}'],
     "nvcc: measured none (CUDA_HOME=/opt/no-cuda: no /opt/no-cuda/bin/nvcc), expected the CUDA toolkit", "verify"),
])
def test_03_refused_before_any_restart(args, said, stage):
    r = up(*FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    pid, live = main_pid(H), manifest()["id"]
    r = up(*SG, *args)
    assert r.returncode == {"preflight": 3, "verify": 4}[stage], r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert said in out, out[-3000:]
    assert main_pid(H) == pid and manifest()["id"] == live   # nothing restarted, nothing switched


def test_03b_a_cuda_toolkit_without_curand_s_headers_is_refused_before_any_restart():
    """nvcc alone (CUDA's minimal install): FlashInfer's sampling kernels include cuRAND's headers from that toolkit's
    include directory only, so SGLang would load and fail its first sampled request's JIT compile ("fatal error:
    curand.h: No such file or directory", measured with CUDA 13.0's nvcc on this project's machine)."""
    sh(H, "mkdir -p /opt/cuda-nvcc-only/bin /opt/cuda-nvcc-only/include && "
          "cp /usr/local/bin/nvcc /opt/cuda-nvcc-only/bin/")
    pid, live = main_pid(H), manifest()["id"]
    r = up(*SG, "-e", '{"deployer_env_extra": {"CUDA_HOME": "/opt/cuda-nvcc-only"}}')
    assert r.returncode == 4, r.stdout + r.stderr
    assert "curand: measured none (no /opt/cuda-nvcc-only/include/curand_kernel.h), expected cuRAND's headers" in \
        flat(r.stdout + r.stderr), (r.stdout + r.stderr)[-3000:]
    assert main_pid(H) == pid and manifest()["id"] == live


def test_04_drafter_without_config_json_is_refused_before_anything_changes(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 64)
    pid = main_pid(H)
    r = up(*SG, "-e", f"deployer_drafter_src_dir={tmp_path}")
    assert r.returncode != 0
    assert f"drafter: {tmp_path}/config.json not found" in r.stdout + r.stderr
    assert main_pid(H) == pid


def test_05_sglang_without_the_eagle3_hook_is_refused_from_its_source_and_the_standin_fails_as_sglang_does():
    src = f"{SG_VENV}/lib/python3.11/site-packages/sglang/srt/models/kimi_k25.py"
    r = up(*SG, *FAST)                  # the SGLang venv installed (and this release live)
    assert r.returncode == 0, r.stdout + r.stderr
    # an SGLang whose outer Kimi class lacks the hook (0.5.9): sed -i writes a new file, the cache stays intact
    sh(H, f"sed -i 's/def set_eagle3_layers_to_capture/def _no_eagle3_hook/' {src}")
    try:
        pid = main_pid(H)
        r = up(*SG, *FAST, "-e", "deployer_max_model_len=65536")   # a new release on that SGLang
        out = r.stdout + r.stderr
        assert r.returncode != 0
        assert "KimiK25ForConditionalGeneration does not define set_eagle3_layers_to_capture" in out, out[-3000:]
        assert main_pid(H) == pid
        # had it been started anyway: SGLang's own ValueError after the weight load, which the watch names
        log = sh(H, f"cd /tmp && DEPLOYER_STANDIN_STATE=/tmp/s5 timeout 60 {SG_VENV}/bin/python "
                    "/usr/local/lib/deployer-sandbox/vllm_standin.py serve --model-path /srv/models/Kimi-K2.5 "
                    "--port 8999 --speculative-algorithm EAGLE3 --speculative-draft-model-path /nonexistent "
                    "2>/dev/null; echo rc=$?", check=False)
        assert "rc=1" in log
        assert ("ValueError: Model KimiK25ForConditionalGeneration does not implement set_eagle3_layers_to_capture, "
                "which EAGLE3 aux hidden-state capture requires.") in log, log
        from deployer.host.module_utils.engine_logs import LoadState
        st = LoadState("sglang")
        st.feed(log, 1.0)
        # SGLang checks the hook in its attention backends' set-up, after both loads and the KV pools
        assert st.fatal and st.fatal[0] == "eagle3_interface" and st.phase == "kv_cache"
    finally:
        sh(H, f"sed -i 's/def _no_eagle3_hook/def set_eagle3_layers_to_capture/' {src}")
