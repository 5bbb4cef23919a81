"""The memory plan: whether one request of ``max_model_len`` tokens fits in the KV cache that vLLM will have on each
GPU, judged before the restart from what is on the host (the shards' own headers, the model's config.json, the GPUs'
memory) - vLLM itself finds out after the whole load (``To serve at least one request with the models's max seq len
...``, docs/real-engine.md).  Pure arithmetic, no I/O; the preflight role feeds it (filter ``memory_plan``).

Per GPU, vLLM's budget is gpu_memory_utilization x the GPU's memory (vllm/v1/worker/gpu_worker.py
``determine_available_memory``); out of it come:

- the weights: each tensor's bytes from the shard headers, divided by the tensor-parallel size, except those every
  rank holds whole (``REPLICATED``: DeepSeek-V3's MLA down-projections ``q_a_proj`` / ``kv_a_proj_with_mqa`` are
  ``ReplicatedLinear``, the MoE router, the norms, Kimi-K2.5's vision tower and projector);
- the drafter: its weights divided by the tensor-parallel size (its linear layers are sharded like the target's);
- the engine's own overhead: ``overhead_gib`` (CUDA context, activations of the profile run, graphs), calibrated on
  what the RTX PRO 6000 community measures (docs/first-deploy.md), plus the sampler's profile, which scales with
  ``max_num_seqs``: vLLM's ``_dummy_sampler_run`` builds max_num_seqs x vocabulary float32 logits and as much again
  for speculation's rejection sampler;
- what is left is the KV cache.  One token costs, on EVERY rank: with MLA, layers x (kv_lora_rank + qk_rope_head_dim)
  x the KV dtype's bytes (the latent is replicated: 61 x 576 x 2 = 70,272 B for Kimi-K2.5); with ordinary attention,
  layers x 2 x (KV heads per rank) x head_dim x bytes; plus the drafter's own layers.

It is an estimate of vLLM's own accounting, stated with every term, so the refusal shows what to change.
"""
from __future__ import annotations

import re

GIB = 1 << 30
# tensors each tensor-parallel rank holds whole (name templates, layer and expert numbers as N): DeepseekV2
# MLAAttention's fused_qkv_a_proj / q_a_proj and kv_a_proj_with_mqa are ReplicatedLinear; the MoE gate (router) and
# its correction bias, every norm; Kimi-K2.5's vision tower and projector (vllm/model_executor/models/kimi_k25.py,
# deepseek_v2.py)
REPLICATED = re.compile(r"(\.q_a_proj\.|\.kv_a_proj_with_mqa\.|\.mlp\.gate\.(weight|e_score_correction_bias)$"
                        r"|(norm|layernorm)\.(weight|bias)$|^(vision_tower|mm_projector|multi_modal_projector)\.)")
# vLLM's own default max_num_seqs on a GPU of 70 GiB or more (vllm/engine/arg_utils.py
# _get_default_max_num_batched_tokens_and_max_num_seqs, OPENAI_API_SERVER)
VLLM_DEFAULT_MAX_NUM_SEQS = 1024
KV_DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
                  "fp8_inc": 1, "fp8_ds_mla": 1}


class MemoryPlanError(ValueError):
    """The inputs cannot be planned (a config without the fields the arithmetic needs)."""


def weights(groups: dict, tp: int) -> tuple[int, int]:
    """(sharded bytes, replicated bytes) of the checkpoint's tensor groups."""
    rep = sum(b for k, b in groups.items() if REPLICATED.search(k))
    return sum(groups.values()) - rep, rep


# A checkpoint's config.json is the checkpoint's word (issue 53 N12): every number the arithmetic uses is an integer
# within what a model can have (a bigger one asked for an allocation as large as it said; 0 divided by zero)
MAX_FIELD = 1 << 30


def _int(cfg: dict, key: str, where: str, low: int = 0, default=None) -> int:
    v = cfg.get(key, default) if isinstance(cfg, dict) else None
    if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= MAX_FIELD:
        raise MemoryPlanError(f"{where}: {key} is {str(v)[:40]!r}, expected an integer from {low} to {MAX_FIELD}")
    return v


def kv_bytes_per_token(cfg: dict, tp: int, dtype_bytes: int, where: str = "config.json") -> int:
    """KV bytes one token costs on each rank, all layers (at least 1)."""
    layers = _int(cfg, "num_hidden_layers", where, 1)
    if cfg.get("kv_lora_rank"):      # MLA: the compressed latent and the rope key, replicated on every rank
        return layers * (_int(cfg, "kv_lora_rank", where, 1) + _int(cfg, "qk_rope_head_dim", where)) * dtype_bytes
    heads = _int(cfg, "num_attention_heads", where, 1)
    kv_heads = _int(cfg, "num_key_value_heads", where, 1, heads) if cfg.get("num_key_value_heads") else heads
    head_dim = (_int(cfg, "head_dim", where, 1) if cfg.get("head_dim")
                else max(1, _int(cfg, "hidden_size", where, 1) // heads))
    return layers * 2 * max(1, kv_heads // tp) * head_dim * dtype_bytes


def text_config(model_config: dict) -> dict:
    """The language model's config (Kimi-K2.5 nests it under text_config)."""
    tc = model_config.get("text_config")
    return tc if isinstance(tc, dict) else model_config


def plan(*, gpu_mib: int, gmu: float, tp: int, max_model_len: int | None, max_num_seqs: int | None,
         groups: dict, model_config: dict, drafter_config: dict | None = None, drafter_bytes: int = 0,
         overhead_gib: float = 5.0, kv_cache_dtype: str = "auto") -> dict:
    """Every term per GPU in bytes and the verdict: ``fits``, ``tokens`` (the KV cache's size in tokens), and
    ``message`` (the numbers, and when it does not fit, what to change)."""
    tc = text_config(model_config)
    dtype_bytes = KV_DTYPE_BYTES.get(str(kv_cache_dtype), 2)
    need_tokens = max_model_len or _int(tc, "max_position_embeddings", "config.json text_config")
    seqs = max_num_seqs or VLLM_DEFAULT_MAX_NUM_SEQS
    vocab = _int(tc, "vocab_size", "config.json text_config")
    total = gpu_mib * (1 << 20)
    budget = int(total * gmu)
    sharded, replicated = weights(groups, tp)
    w = sharded // tp + replicated
    drafter = drafter_bytes // tp if drafter_config else 0
    per_token = kv_bytes_per_token(tc, tp, dtype_bytes)
    drafter_token = kv_bytes_per_token(drafter_config, tp, dtype_bytes, "drafter config.json") if drafter_config else 0
    overhead = int(overhead_gib * GIB)
    sampler = seqs * vocab * 4 * (2 if drafter_config else 1)
    room = budget - w - drafter - overhead - sampler
    tokens = max(room, 0) // (per_token + drafter_token)
    need_kv = need_tokens * (per_token + drafter_token)
    length = "deployer_max_model_len" if max_model_len else "the model's max_position_embeddings"
    fits = room >= need_kv

    def g(b):
        return f"{b / GIB:.1f} GiB"

    kv_terms = f"{per_token:,} B" + (f" + drafter {drafter_token:,} B" if drafter_token else "")
    message = (f"memory plan per GPU: {gpu_mib} MiB x gpu_memory_utilization {gmu} = {g(budget)}; weights {g(w)} "
               f"({g(sharded)} / {tp} ranks + {g(replicated)} on every rank)"
               + (f", drafter {g(drafter)}" if drafter_config else "")
               + f", engine overhead {g(overhead)} + sampler profile {g(sampler)} ({seqs} sequences) leave "
               f"{g(max(room, 0))} for the KV cache: {tokens:,} tokens at {kv_terms} per token; "
               f"{length} {need_tokens:,} needs {g(need_kv)}")
    if not fits:
        fixed = w + drafter + overhead + sampler
        want_gmu = (fixed + need_kv) / total
        fixes = [f"lower deployer_max_model_len to <= {tokens:,}" if tokens else None,
                 f"raise deployer_gpu_memory_utilization to >= {want_gmu + 0.005:.2f}" if want_gmu < 0.975 else None,
                 f"lower deployer_max_num_seqs ({seqs})" if sampler >= GIB // 2 else None]
        message += ("; expected room for one request of that length (vLLM would refuse it after the whole load): "
                    + (", or ".join(f for f in fixes if f) or "fewer tokens or more GPUs"))
    return dict(fits=fits, tokens=tokens, need_tokens=need_tokens, budget=budget, weights=w, sharded=sharded,
                replicated=replicated, drafter=drafter, overhead=overhead, sampler=sampler, kv_room=max(room, 0),
                kv_bytes_per_token=per_token + drafter_token, message=message)
