"""The SGLang backend's pure parts: its plan and argv, the refusals the deployer encodes (versions, sm_120,
owned flags), its log phases and metrics, and the source capability check on fabricated SGLang trees."""
import pytest
from test_render_golden import settings

from deployer import identity, plan
from deployer.ansible_plugins.filter_plugins.deployer_filters import parse_gpu_csv, sm120_refusals
from deployer.engines import argv as serve
from deployer.engines import sglang_argv as serve_sglang
from deployer.host.module_utils import host_probe, releases, sglang_source
from deployer.host.module_utils.engine_logs import LoadState
from deployer.host.module_utils.spec_metrics import spec_decode_delta, spec_decode_stats

# the settings' defaults (roles/deployer/defaults/main.yml), these few set
BASE = settings(root="/opt/deployer", vllm_version="0.16.0", sglang_version="0.5.23", service_name="deployer-engine",
                port=8000, model_dir="/srv/models/Kimi-K2.5", served_model_name="kimi-k2.5", tensor_parallel_size=8,
                gpu_memory_utilization=0.9, max_model_len=131072, api_key="k3y", patch_engine_id="abcd1234",
                extra_args=[], device_allow=[], env_extra={})
MANIFEST = {"tree_sha256": "ab" * 32, "files": [], "bytes": 1, "architecture": "LlamaForCausalLMEagle3"}


def sg(**kw):
    return plan.make_plan(dict(BASE, backend="sglang", **kw), dict(MANIFEST))


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_sglang_plan_names_its_engine_venv_and_launch():
    p = sg()
    assert p["engine"] == {"name": "sglang", "label": "SGLang", "package": "sglang", "version": "0.5.23",
                           # what the roles read instead of comparing engine names (deployer/engines)
                           "patchable": False, "capability_probe": True, "verifier": "sglang_verify.py",
                           "log_rules": "sglang", "drafts_metric": "sglang:spec_verify_calls_total",
                           "metrics_rules": "sglang",
                           # its /health generates a token once up (up to 20 s): the watch waits that long
                           "health_timeout_seconds": 22.0,
                           # where its kernels are: the verify stage reads the driver they need
                           "cuda_libraries": {"sgl_kernel/*.so": "sgl-kernel",
                                              "sgl_kernel/*/*.so": "sgl-kernel, per-architecture builds"},
                           # the GPU canary before the restart: CUDA, NCCL, Triton and FlashInfer's sampling (JIT)
                           "gpu_canary": True, "canary_probes": ["sglang_flashinfer_sampling"],
                           # FlashInfer's JIT: the verify stage checks these for the service user
                           "jit_toolchain": ["nvcc", "ninja", "c++", "curand"],
                           # what its verifier holds extra words to: SGLang's ServerArgs fields of its own flags
                           "managed_dests": ["api_key", "attention_backend", "context_length", "device",
                                             "enable_metrics", "host", "kv_cache_dtype", "language_model_only",
                                             "mem_fraction_static", "model", "model_path", "port", "reasoning_parser",
                                             "served_model_name", "speculative_algorithm",
                                             "speculative_draft_attention_backend", "speculative_draft_model_path",
                                             "speculative_eagle_topk", "speculative_num_draft_tokens",
                                             "speculative_num_steps", "tensor_parallel_size", "tool_call_parser", "tp",
                                             "tp_size", "trust_remote_code"]}
    assert p["draft_tokens_per_step"] == 3      # --speculative-num-draft-tokens 4: the last accepted + 3 drafts
    assert p["venv"] == "/opt/deployer/venvs/sglang-0.5.23" and p["vllm_version"] is None
    assert p["patch_state"] == "absent"
    a = p["argv"]
    assert a[:4] == ["/opt/deployer/venvs/sglang-0.5.23/bin/sglang", "serve", "--model-path", "/srv/models/Kimi-K2.5"]
    assert flag(a, "--tp-size") == "8" and flag(a, "--context-length") == "131072"
    assert flag(a, "--speculative-algorithm") == "EAGLE3"
    assert flag(a, "--speculative-draft-model-path") == "/opt/deployer/drafters/" + "ab" * 8
    assert (flag(a, "--speculative-num-steps"), flag(a, "--speculative-eagle-topk"),
            flag(a, "--speculative-num-draft-tokens")) == ("3", "1", "4")
    assert flag(a, "--attention-backend") == "triton" and flag(a, "--speculative-draft-attention-backend") == "triton"
    assert "--enable-metrics" in a and "--api-key" not in a and "k3y" not in " ".join(a)
    assert a[-2:] == ["--config", "{credentials}/sglang-secrets.yaml"]
    assert p["credentials"] == {"sglang-secrets.yaml": "sglang-secrets.yaml"}
    assert not any(k.startswith("VLLM_") for k in p["env"])


def test_no_api_key_means_no_secret_file_and_loopback_only():
    p = sg(api_key="", host="127.0.0.1")
    assert p["credentials"] == {} and "--config" not in p["argv"]


def test_the_same_settings_on_another_engine_are_another_release():
    v = plan.make_plan(dict(BASE), dict(MANIFEST))
    assert identity.release_id(v, "fp") != identity.release_id(sg(), None)
    assert v["engine"]["name"] == "vllm" and v["venv"].startswith("/opt/deployer/venvs/vllm-0.16.0-p")


def test_the_unit_hands_the_secret_file_over_as_systemd_specifier_d_and_escapes_every_other_percent():
    line = serve.exec_start(["/x/sglang", "--config", "{credentials}/sglang-secrets.yaml", "--served-model-name",
                             "a%d", "{credentials}-not-a-path"])
    assert '"--config" "%d/sglang-secrets.yaml"' in line
    assert '"a%%d"' in line and '"{credentials}-not-a-path"' in line


@pytest.mark.parametrize("version, arch, lmo, said", [
    ("0.5.8", "LlamaForCausalLMEagle3", False, "SGLang 0.5.8 has no Kimi-K2.5 model class"),
    ("0.5.8.post1", "LlamaForCausalLMEagle3", False, "has no Kimi-K2.5 model class"),
    ("0.5.9", "LlamaForCausalLMEagle3", False, "lacks set_eagle3_layers_to_capture"),
    ("0.5.11", "Eagle3DeepseekV2ForCausalLM", False, "has no Eagle3DeepseekV2ForCausalLM"),
    ("0.5.17", "LlamaForCausalLMEagle3", True, "has no --language-model-only"),
    ("latest", "LlamaForCausalLMEagle3", False, "expected a release like 0.5.23"),
])
def test_versions_that_cannot_serve_kimi_k25_with_eagle3_are_refused_by_the_plan(version, arch, lmo, said):
    with pytest.raises(plan.PlanError, match=said):
        plan.make_plan(dict(BASE, backend="sglang", sglang_version=version, sglang_language_model_only=lmo),
                       dict(MANIFEST, architecture=arch))


@pytest.mark.parametrize("version, arch", [("0.5.10", "LlamaForCausalLMEagle3"),
                                           ("0.5.12", "Eagle3DeepseekV2ForCausalLM"),
                                           ("0.5.23", "Eagle3DeepseekV2ForCausalLM")])
def test_versions_that_can_are_planned(version, arch):
    assert plan.make_plan(dict(BASE, backend="sglang", sglang_version=version), dict(MANIFEST, architecture=arch))


def test_without_speculation_an_old_kimi_class_suffices():
    p = plan.make_plan(dict(BASE, backend="sglang", sglang_version="0.5.9", speculative_enabled=False), None)
    assert "--speculative-algorithm" not in p["argv"]


@pytest.mark.parametrize("extra, said", [
    (["--api-key", "x"], "--api-key is set by the deployer.*secret file"),
    (["--tp-size=4"], "--tp-size is set by the deployer"),
    (["--speculative-num-draft", "8"], "abbreviates --speculative-num-draft-tokens"),
    (["--config", "/tmp/x.yaml"], "--config is set by the deployer"),
    (["--x={credentials}/y"], "contains a newline, NUL or {credentials}"),
])
def test_flags_the_deployer_owns_are_refused_in_extra_args(extra, said):
    with pytest.raises(plan.PlanError, match=said):
        sg(sglang_extra_args=extra)


def test_draft_tokens_must_fit_a_chain_when_topk_is_one():
    with pytest.raises(plan.PlanError, match="expected num_speculative_tokens \\+ 1 = 4"):
        sg(sglang_num_draft_tokens=8)
    a = sg(sglang_eagle_topk=4, sglang_num_draft_tokens=8)["argv"]
    assert flag(a, "--speculative-eagle-topk") == "4" and flag(a, "--speculative-num-draft-tokens") == "8"


@pytest.mark.parametrize("backend_flag", ["trtllm_mla", "cutedsl_mla", "fa3", "flashmla"])
def test_attention_backends_without_sm120_kernels_are_refused_on_blackwell_rtx_only(backend_flag):
    p = sg(sglang_attention_backend=backend_flag)
    gpus = parse_gpu_csv("NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887 MiB, 580.95.05, 0 MiB, 12.0\n" * 8)
    assert gpus[0]["compute_cap"] == "12.0"
    said = sm120_refusals(p, gpus)
    assert len(said) == 1 and said[0].startswith(f"--attention-backend {backend_flag}: ") and "use triton" in said[0]
    hopper = parse_gpu_csv("NVIDIA H200, 143771 MiB, 580.95.05, 0 MiB, 9.0\n")
    assert hopper[0]["mig"] == ""
    assert parse_gpu_csv("NVIDIA RTX PRO 6000 Blackwell, 97887 MiB, 580.95.05, 0 MiB, 12.0, Enabled\n")[0]["mig"] \
        == "Enabled"
    assert sm120_refusals(p, hopper) == []
    assert sm120_refusals(sg(), gpus) == []                                    # triton: fine
    assert sm120_refusals(plan.make_plan(dict(BASE), dict(MANIFEST)), gpus) == []   # vLLM: not SGLang's rules


def test_the_draft_backend_and_equals_spelling_are_checked_too():
    a = ["sglang", "serve", "--speculative-draft-attention-backend", "fa3", "--attention-backend=flashmla"]
    assert sorted(m.split(":")[0] for m in serve_sglang.sm120_refusals(a, ["12.0"])) == [
        "--attention-backend flashmla", "--speculative-draft-attention-backend fa3"]


# ------------------------------------------------------------------ SGLang's log lines and metrics
def _ranks(line, n=8, **kw):
    """One line as each of ``n`` tensor-parallel ranks logs it (SGLang's logger.info runs in every scheduler)."""
    return "".join("[2026-12-01 09:08:%s TP%d] %s\n" % (kw.get("sec", "27"), r, line.format(r=r)) for r in range(n))


# SGLang 0.5.23 at --tp-size 8, in the order of its own start-up (managers/scheduler.py, init_model_worker: target
# weights, drafter weights, KV pools target then drafter, attention backends, CUDA graphs target then drafter) and
# with its own line shapes (model_runner.py, memory_pool.py, cuda_graph_setup.py, eagle_worker_v2.py): every rank
# logs the weight, pool and target-graph lines; the drafter's graph lines are rank 0's only (log_info_on_rank0)
SG_LOG = (
    _ranks("Load weight begin. avail mem=93.12 GB")
    + "\rLoading safetensors checkpoint shards:  50% Completed | 32/64 [00:01<00:01, 30.1it/s]"
      "\rLoading safetensors checkpoint shards: 100% Completed | 64/64 [00:02<00:00, 30.1it/s]\n"
    + _ranks("Load weight end. elapsed=2.{r}0 s, type=KimiK25ForConditionalGeneration, avail mem=20.51 GB, "
             "mem usage=72.61 GB.", sec="29")
    + _ranks("Load weight begin. avail mem=20.51 GB", sec="29")
    + _ranks("Load weight end. elapsed=0.3{r} s, type=LlamaForCausalLMEagle3, avail mem=19.31 GB, "
             "mem usage=1.20 GB.", sec="30")
    + _ranks("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 418016, KV size: 11.42 GB", sec="30")
    + _ranks("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 418016, K size: 0.20 GB, V size: 0.20 GB",
             sec="30")
    + _ranks("Memory pool end. avail mem=8.10 GB", sec="30")
    + _ranks("Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4, avail mem=8.10 GB", sec="30")
    + _ranks("Capture target verify CUDA graph end. bs=[1, 2, 4, 8], elapsed=0.60 s, mem usage=1.20 GB, "
             "avail mem=6.90 GB.", sec="31")
    + "[2026-12-01 09:08:31 TP0] Capture draft decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
      "bs=[1, 2, 4, 8], avail mem=6.90 GB\n"
    + "[2026-12-01 09:08:32 TP0] Capture draft decode CUDA graph end. elapsed=0.15 s, mem usage=0.40 GB, "
      "avail mem=6.50 GB.\n"
    + "INFO:     Application startup complete.\n"
    + "[2026-12-01 09:08:33] The server is fired up and ready to roll!\n"
    + "[2026-12-01 09:08:35 TP0] Decode batch, #running-req: 1, #token: 8, token usage: 0.00, accept len: 2.95, "
      "accept rate: 0.65, cuda graph: True\n")


def test_sglang_load_phases_and_facts_from_its_lines():
    st, seen = LoadState("sglang"), []
    for t, line in enumerate(SG_LOG.split("\n")):      # (str.splitlines would also split at tqdm's \r)
        st.feed(line, float(t))
        seen.append(st.phase)
        if "50% Completed" in line:
            assert st.percent() == 100.0     # the line carries both redraws; the last one counts
    # a second rank's first "Load weight begin" is not the drafter's: only a rank's second one is
    assert [p for i, p in enumerate(seen) if i == 0 or p != seen[i - 1]] == [
        "weights", "drafter", "kv_cache", "graphs", "api", "ready"]
    f = st.facts
    assert f["weights_seconds"] == 2.0 and f["model_class"] == "KimiK25ForConditionalGeneration"   # rank 0's
    assert f["drafter_weights_seconds"] == 0.30 and f["drafter_class"] == "LlamaForCausalLMEagle3"
    # the target's pool is the KV cache; the drafter's second line does not overwrite it
    assert f["kv_cache_tokens"] == 418016 and f["kv_cache_gib"] == 11.42 and f["drafter_kv_cache_gib"] == 0.4
    # rank 0's graph seconds, the target's end line with its bs=[...] before elapsed= included
    assert f["graphs_seconds"] == 0.75
    assert f["log_mean_acceptance_length"] == 2.95 and f["log_acceptance_rate"] == 0.65
    assert st.fatal is None
    durations = st.phase_durations(float(len(SG_LOG.split("\n"))))
    assert durations["weights"] > 0 and durations["drafter"] > 0


def test_a_missing_eagle3_hook_is_named_in_the_kv_phase_where_sglang_checks_it():
    """configure_aux_hidden_state_capture runs in init_attention_backends, after both loads and the KV pools."""
    st = LoadState("sglang")
    head = SG_LOG.split("Memory pool end")[0]
    st.feed(head, 1.0)
    st.feed("[2026-12-01 09:08:30 TP0] Scheduler hit an exception: Traceback (most recent call last):\n", 2.0)
    st.feed("ValueError: Model KimiK25ForConditionalGeneration does not implement set_eagle3_layers_to_capture, "
            "which EAGLE3 aux hidden-state capture requires.\n", 2.0)
    assert st.fatal[0] == "eagle3_interface" and st.phase == "kv_cache"


def test_sglang_failures_are_named():
    st = LoadState("sglang")
    st.feed("[2026-11-30 09:24:19 TP0] Load weight begin. avail mem=93.12 GB\n", 1.0)
    st.feed("[2026-11-30 09:24:19 TP0] Scheduler hit an exception: Traceback (most recent call last):\n", 2.0)
    st.feed("ValueError: Model KimiK25ForConditionalGeneration does not implement set_eagle3_layers_to_capture, "
            "which EAGLE3 aux hidden-state capture requires.\n", 2.0)
    assert st.fatal[0] == "eagle3_interface" and "set_eagle3_layers_to_capture" in st.fatal[1]
    st = LoadState("sglang")
    st.feed("[2026-11-30 09:24:19] Received sigquit from a child process. It usually means the child failed.\n", 1.0)
    assert st.fatal[0] == "engine_dead"


SG_METRICS = """\
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="kimi-k2.5",engine_type="unified",tp_rank="1",pp_rank="0",moe_ep_rank="1"} 1.5
sglang:spec_accept_length{model_name="kimi-k2.5",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 2.8
# TYPE sglang:spec_accept_rate gauge
sglang:spec_accept_rate{model_name="kimi-k2.5",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 0.6
# TYPE sglang:spec_verify_calls counter
sglang:spec_verify_calls_total{model_name="kimi-k2.5"} 7.0
"""


def test_sglang_acceptance_in_the_same_fields_as_vllms():
    s = spec_decode_stats(SG_METRICS)       # gauges only (no generation counter): rank 0's
    assert s["present"] and s["acceptance_rate"] == 0.6 and s["mean_acceptance_length"] == 2.8
    before = spec_decode_stats(SG_METRICS.replace("} 7.0", "} 3.0"))
    d = spec_decode_delta(before, s)
    assert d["drafts"] == 4.0 and d["acceptance_rate"] == 0.6
    assert not spec_decode_stats("sglang:num_running_reqs 0\n")["present"]


# SGLang 0.5.23's /metrics after ONE 32-token request on a fresh server (metrics_collector.py): the counters
# moved (32 tokens, 1 request, 11 verify steps), the gauges did not - they are set every decode_log_interval (40)
# decode steps, and 11 < 40
SG_FRESH = """\
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="kimi-k2.5",is_streaming="false"} 32.0
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{model_name="kimi-k2.5",is_streaming="false"} 1.0
# TYPE sglang:spec_verify_calls_total counter
sglang:spec_verify_calls_total{model_name="kimi-k2.5"} 11.0
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="kimi-k2.5",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 0.0
# TYPE sglang:spec_accept_rate gauge
sglang:spec_accept_rate{model_name="kimi-k2.5",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 0.0
"""


def test_sglang_acceptance_comes_from_its_counters_on_a_fresh_server():
    """11 verify steps gave 31 tokens (the first is the prefill's): 20 accepted of 33 proposed (3 per step)."""
    s = spec_decode_stats(SG_FRESH, 3)
    assert s["acceptance_rate"] == round(20 / 33, 4) and s["mean_acceptance_length"] == round(1 + 20 / 11, 4)
    assert s["num_drafts"] == 11 and s["source"] == "counters"
    d = spec_decode_delta(spec_decode_stats("", 3), s)
    assert d["drafts"] == 11 and d["acceptance_rate"] == round(20 / 33, 4)
    # a second request: the rates over it alone
    later = spec_decode_stats(SG_FRESH.replace("} 32.0", "} 57.0").replace("} 1.0", "} 2.0")
                              .replace("} 11.0", "} 19.0"), 3)
    d = spec_decode_delta(s, later)
    assert d["drafts"] == 8 and d["acceptance_rate"] == round((25 - 1 - 8) / 24, 4)
    # without the drafts per step only the length is known; the gauges (0 here) are not taken for a rate
    assert spec_decode_stats(SG_FRESH)["acceptance_rate"] is None


# ------------------------------------------------------------------ the installed source, fabricated
def fake_sglang(tmp_path, kimi_body="", with_class=True, models=None, version="0.5.23"):
    root = tmp_path / "site-packages" / "sglang"
    (root / "srt" / "models").mkdir(parents=True)
    (root / "srt" / "server_args.py").write_text("")
    meta = tmp_path / "site-packages" / f"sglang-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Name: sglang\nVersion: {version}\n")
    if with_class:
        (root / "srt" / "models" / "kimi_k25.py").write_text(
            "class KimiK25ForConditionalGeneration(nn.Module):\n    def forward(self):\n        pass\n" + kimi_body)
    for name, text in (models or {}).items():
        (root / "srt" / "models" / name).write_text(text)
    return str(root)


HOOK = "    def set_eagle3_layers_to_capture(self, layer_ids=None):\n        pass\n"


def test_capability_from_source(tmp_path):
    root = fake_sglang(tmp_path, HOOK, models={"llama_eagle3.py": "class LlamaForCausalLMEagle3:\n    pass\n"})
    assert sglang_source.sglang_root_of(root) == root
    c = sglang_source.capability(root, "LlamaForCausalLMEagle3")
    assert c["problems"] == [] and c["eagle3_hook"] and c["drafter_class"] == "srt/models/llama_eagle3.py"
    assert c["version"] == "0.5.23"
    assert "has no model class Eagle3DeepseekV2ForCausalLM" in sglang_source.capability(
        root, "Eagle3DeepseekV2ForCausalLM")["problems"][0]


def test_a_hook_on_another_class_does_not_count(tmp_path):
    root = fake_sglang(tmp_path, "class DeepseekV3ForCausalLM:\n" + HOOK)
    c = sglang_source.capability(root, "LlamaForCausalLMEagle3")
    assert not c["eagle3_hook"]
    assert any("does not define set_eagle3_layers_to_capture" in p for p in c["problems"])
    assert sglang_source.capability(root, "")["problems"] == []    # speculation off: the class is enough


def test_no_kimi_class(tmp_path):
    root = fake_sglang(tmp_path, with_class=False, version="0.5.8")
    assert "SGLang 0.5.8 has no KimiK25ForConditionalGeneration" in sglang_source.capability(root, "")["problems"][0]
    with pytest.raises(sglang_source.SourceError):
        sglang_source.sglang_root_of(str(tmp_path / "nothing"))


def test_sglang_venvs_are_native_and_their_key_is_read_back(tmp_path):
    v = tmp_path / "venvs" / "sglang-0.5.23"
    v.mkdir(parents=True)
    (v / ".deployer-installed").write_text("0.5.23\n")
    assert host_probe._venv_state(str(v), patchable=False)["state"] == "native"     # the engine's word, not the name
    (tmp_path / "sglang-secrets.yaml").write_text('# comment\napi-key: "k\\"ey"\n')
    assert releases._sglang_api_key(str(tmp_path)) == 'k"ey'
    assert releases._sglang_api_key(str(tmp_path / "none")) == ""
