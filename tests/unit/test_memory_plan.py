"""The memory plan (deployer/memory_plan.py): what preflight predicts of vLLM's KV cache per GPU, from the shards'
headers the host module groups (safetensors_header.template), on the sandbox's header-true Kimi-K2.5 checkpoint."""
import json
import math

import pytest
from test_render_golden import settings

from deployer import memory_plan as mp
from deployer.ansible_plugins.filter_plugins.deployer_filters import memory_plan as memory_filter
from deployer.host.module_utils.safetensors_header import check_shards, template
from deployer.plan import make_plan
from deployer.sandbox import checkpoints

GPU_MIB = 97887     # what nvidia-smi reports for an RTX PRO 6000 Blackwell


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    """The sandbox hosts' checkpoint, written as they get it (sparse), and what the host module reads of it."""
    d = tmp_path_factory.mktemp("kimi")
    checkpoints.write_model_dir(d, header_true=True)
    files = sorted(set(json.loads((d / "model.safetensors.index.json").read_text())["weight_map"].values()))
    groups = {}
    bad, checked, total = check_shards(str(d), files, groups=groups)
    assert not bad and checked == 64
    return d, groups, total


def drafter():
    cfg = checkpoints.drafter_config()
    size = sum(checkpoints.DTYPE_BYTES[dt] * math.prod(shape) for dt, shape in checkpoints.drafter_tensors().values())
    return cfg, size


def plan(kimi, **kw):
    d, groups, _ = kimi
    cfg, size = drafter()
    args = dict(gpu_mib=GPU_MIB, gmu=0.94, tp=8, max_model_len=131072, max_num_seqs=128, groups=groups,
                model_config=json.loads((d / "config.json").read_text()), drafter_config=cfg, drafter_bytes=size)
    args.update(kw)
    return mp.plan(**args)


def test_the_sandbox_checkpoint_is_the_real_ones_size_and_sparse(kimi):
    d, groups, total = kimi
    # ~595 GB on disk (the hub's recipe), 64 shards, the routed experts packed INT4: every byte from the headers
    assert 594e9 < total < 596e9, total
    assert sum(f.stat().st_blocks * 512 for f in d.iterdir()) < 200 << 20      # holes, not data
    assert groups["language_model.model.layers.N.mlp.experts.N.gate_proj.weight_packed"] == 60 * 384 * 2048 * 7168 // 2
    assert len(groups) < 100      # ~200,000 tensors reach the controller as a few dozen groups


def test_template_folds_layer_and_expert_numbers():
    assert template("language_model.model.layers.17.mlp.experts.255.up_proj.weight_scale") == \
        "language_model.model.layers.N.mlp.experts.N.up_proj.weight_scale"
    assert template("mm_projector.proj.0.weight") == "mm_projector.proj.N.weight"
    assert template("x.layer10a.weight") == "x.layer10a.weight"


def test_the_defaults_fit_with_the_numbers_shown(kimi):
    r = plan(kimi)
    assert r["fits"], r["message"]
    # the per-GPU weights the review estimated (71.8 GiB), MLA's latent replicated on every rank (61 x 576 x 2 B)
    assert round(r["weights"] / mp.GIB, 1) == 71.8
    assert r["kv_bytes_per_token"] == 61 * 576 * 2 + 1 * 2 * 8 * 128 * 2
    assert 170_000 < r["tokens"] < 190_000, r["tokens"]
    assert "weights 71.8 GiB (551.4 GiB / 8 ranks + 2.9 GiB on every rank)" in r["message"]


def test_the_old_default_utilization_is_refused_with_what_to_change(kimi):
    r = plan(kimi, gmu=0.90)
    assert not r["fits"]
    assert "leave 8.8 GiB for the KV cache: 126,657 tokens at 70,272 B + drafter 4,096 B per token" in r["message"]
    assert "deployer_max_model_len 131,072 needs 9.1 GiB" in r["message"]
    assert "lower deployer_max_model_len to <= 126,657, or raise deployer_gpu_memory_utilization to >= 0.91" \
        in r["message"]


def test_the_models_full_length_is_refused_and_no_utilization_can_fix_it(kimi):
    r = plan(kimi, max_model_len=262144)
    assert not r["fits"] and "deployer_max_model_len 262,144 needs 18.2 GiB" in r["message"]
    assert "raise deployer_gpu_memory_utilization" not in r["message"]
    assert "lower deployer_max_model_len to <= 1" in r["message"]
    r = plan(kimi, max_model_len=None)        # null: the model's own 262144
    assert not r["fits"] and "the model's max_position_embeddings 262,144" in r["message"]


def test_vllms_default_sequences_cost_the_sampler_profile(kimi):
    ours, theirs = plan(kimi), plan(kimi, max_num_seqs=None)
    assert theirs["sampler"] == 1024 * 163840 * 4 * 2 and "(1024 sequences)" in theirs["message"]
    assert theirs["tokens"] < ours["tokens"]


def test_the_community_calibration_point(kimi):
    """8x RTX PRO 6000, BF16 KV, no drafter, vLLM's default sequences: ~190,000 tokens at gmu 0.93-0.95
    (docs/first-deploy.md); the plan's overhead is set so that it lands there."""
    r = plan(kimi, drafter_config=None, max_num_seqs=None)
    assert 180_000 < r["tokens"] < 200_000, r["tokens"]


def test_kv_bytes_for_ordinary_attention_and_fp8():
    llama = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}
    assert mp.kv_bytes_per_token(llama, tp=2, dtype_bytes=2) == 32 * 2 * 4 * 128 * 2
    assert mp.kv_bytes_per_token(llama, tp=16, dtype_bytes=2) == 32 * 2 * 1 * 128 * 2   # a head is never split
    mla = checkpoints.kimi_config()["text_config"]
    assert mp.kv_bytes_per_token(mla, tp=8, dtype_bytes=1) == 61 * 576


def test_a_config_without_the_fields_is_an_error():
    with pytest.raises(mp.MemoryPlanError, match="num_hidden_layers is 'None'"):
        mp.kv_bytes_per_token({}, 8, 2)


@pytest.mark.parametrize("field,value", [
    ("num_hidden_layers", 0), ("num_hidden_layers", 1 << 40), ("kv_lora_rank", "x"), ("qk_rope_head_dim", -1),
    ("num_hidden_layers", True), ("qk_rope_head_dim", [1] * 10000)])
def test_a_hostile_config_is_refused_by_the_filter_never_a_traceback_or_an_allocation(kimi, field, value):
    """Issue 53 N12: num_hidden_layers 0 raised ZeroDivisionError out of the filter (a traceback), a string field
    made per_token a string as long as the file asked, a layer count had no upper bound."""
    d, groups, _ = kimi
    cfg = json.loads((d / "config.json").read_text())
    cfg["text_config"][field] = value
    r = memory_filter(make_plan(SETTINGS), [{"memory_mib": GPU_MIB}] * 8, {"tensor_groups": groups}, json.dumps(cfg))
    assert r["fits"] is False and r["message"].startswith("memory plan: cannot read what it needs"), r
    assert field in r["message"] and len(r["message"]) < 600


def test_a_config_nested_past_recursion_is_refused_by_the_filters():
    from deployer.ansible_plugins.filter_plugins.deployer_filters import drafter_fit
    deep = "[" * 100000 + "]" * 100000
    r = memory_filter(make_plan(SETTINGS), [{"memory_mib": GPU_MIB}] * 8, {"tensor_groups": {"x": 1}}, deep)
    assert r["fits"] is False and "cannot read" in r["message"]
    r = drafter_fit(json.loads('{"a": 1}'), "/nonexistent-drafter", {"name": "vllm"})
    assert r["refusals"] and r["refusals"][0].startswith("drafter /nonexistent-drafter")


# the settings' defaults (roles/deployer/defaults/main.yml) with these set
SETTINGS = settings(root="/opt/deployer", backend="vllm", vllm_version="0.18.0", service_name="deployer-engine",
                    port=8000, host="127.0.0.1", service_user="vllm", model_dir="/srv/models/Kimi-K2.5",
                    served_model_name="kimi-k2.5", speculative_enabled=False, tensor_parallel_size=8,
                    gpu_memory_utilization=0.94, max_model_len=131072, max_num_seqs=128, patch_enabled=False,
                    extra_args=[], device_allow=[], env_extra={})


def test_the_filter_reads_the_launch_it_judges(kimi):
    """The filter takes every number from the planned argv (what vLLM will be given), the smallest GPU, and plans
    nothing for an engine whose memory is not vLLM's GPU budget."""
    d, groups, _ = kimi
    gpus = [{"memory_mib": GPU_MIB}] * 7 + [{"memory_mib": 81559}]
    cfg = (d / "config.json").read_text()
    p = make_plan(SETTINGS)
    r = memory_filter(p, gpus, {"tensor_groups": groups}, cfg)
    assert not r["fits"] and "81559 MiB x gpu_memory_utilization 0.94" in r["message"]
    assert memory_filter(p, gpus[:7], {"tensor_groups": groups}, cfg)["fits"]
    fp8 = make_plan(dict(SETTINGS, extra_args=["--kv-cache-dtype", "fp8"]))
    assert "at 35,136 B per token" in memory_filter(fp8, gpus[:7], {"tensor_groups": groups}, cfg)["message"]
    assert "cannot read" in memory_filter(p, gpus, {"tensor_groups": groups}, "{not json")["message"]
    # what the host module once returned when a name was reused (the service user's groups, after the first deploy)
    r = memory_filter(p, gpus[:7], {"tensor_groups": []}, cfg)
    assert not r["fits"] and "no tensor sizes were read" in r["message"]
    cpu = make_plan(dict(SETTINGS, backend="vllm-cpu", vllm_version="0.32.0", cpu_kvcache_space_gib=1,
                         cpu_omp_threads_bind="auto"))
    assert memory_filter(cpu, gpus, {"tensor_groups": groups}, cfg) is None


def test_kv_bytes_per_token_is_what_the_real_vllm_measured():
    """vLLM 0.25.1 on a real H200 (tests/fixtures/real-gpu/vllm-0.25.1-h200-bench/good_cold: bench/real_engine/
    make_models.py's MLA target, 6 layers x (512 + 64), and its Llama EAGLE-3 drafter, 8 KV heads x 128) split its
    KV memory into tokens at exactly the plan's bytes per token: the MLA latent and the drafter's own layer."""
    import re
    from pathlib import Path
    out = (Path(__file__).parent.parent / "fixtures/real-gpu/vllm-0.25.1-h200-bench/good_cold/output.bin") \
        .read_bytes().decode("utf-8", "replace")
    gib = float(re.search(r"Available KV cache memory: ([\d.]+) GiB", out).group(1))
    tokens = int(re.search(r"GPU KV cache size: ([\d,]+) tokens", out).group(1).replace(",", ""))
    target = {"num_hidden_layers": 6, "kv_lora_rank": 512, "qk_rope_head_dim": 64}
    drafter = {"num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 128}
    per_token = mp.kv_bytes_per_token(target, 1, 2) + mp.kv_bytes_per_token(drafter, 1, 2)
    assert per_token == 11_008
    assert tokens == pytest.approx(gib * mp.GIB / per_token, rel=0.001)     # the GiB figure is rounded to 0.01
