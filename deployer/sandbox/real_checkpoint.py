"""SANDBOX: a tiny *real* Kimi-K2.5 checkpoint that the real vLLM (its CPU build) loads and serves, and EAGLE-3
drafters for it: one built to agree with its target, one that does not fit.  Pure file writing, no torch: the
weights are deterministic bf16 bytes (a seeded generator), so the same checkpoint (and release id) comes out of
every run.

The target is Kimi-K2.5's own class, ``KimiK25ForConditionalGeneration`` (``model_type: kimi_k25``), whose
``text_config`` is a DeepSeek-V3 MLA + MoE language model with Kimi's MLA dimensions (kv_lora_rank 512 +
qk_rope_head_dim 64 = 576: vLLM's MLA kernels take no other head size: 128 + 32 loads, passes /health and dies at the
first request with ``Head dimension 160 is not supported by MLA``).  Tensor names are the hub checkpoint's
(``language_model.model.layers.N...``, what vLLM's ``kimi_k25.py`` loads).  The vision tower is declared in the
config but has no weights: the deploy serves text only (``--limit-mm-per-prompt {"vision_chunk": 0}``), with which
vLLM builds no tower and loads none of its tensors (``_mark_tower_model``); the tokenizer has no media tokens.

**Why the drafter agrees with its target (acceptance above 0).**  Both final norms are zero: every hidden state the
last norm sees becomes 0, so every logit is exactly 0, and a greedy argmax over equal values takes the first index
(torch.argmax).  The target therefore always answers token 0, and the drafter always proposes its draft token 0,
which ``d2t[0] = 0`` maps to target token 0: every draft is accepted, whatever the (random) layers compute on the
way.  Token 0 is an ordinary word ("hello"), not a special token, so the answer is visible text.  Everything else
is random, so the engine's MLA, MoE routing, EAGLE-3 aux-layer capture and rejection sampler all run for real.

The misfit drafter has another hidden size than the target: the drafter check refuses it before the restart; with
the check forced off, vLLM itself fails when it loads it (after the target's weights).
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from deployer.sandbox.checkpoints import safetensors_bytes

H, V, LAYERS = 256, 2048, 4
HEADS, Q_LORA, KV_LORA, NOPE, ROPE, V_HEAD = 4, 128, 512, 128, 64, 128
EXPERTS, TOPK, MOE_I, DENSE_I = 8, 2, 128, 512
DRAFT_V = 1024                 # below the target's vocabulary: the drafter ships d2t [DRAFT_V] and t2d [V]
AUX_LAYERS = [1, 2, 3]
ANSWER_WORD = "hello"          # token 0: what every greedy step answers
WORDS = (ANSWER_WORD + " the model loads its weights shard by shard a drafter proposes tokens the target verifies "
         "them deploy rollback health served reply with one short sentence what is here ok user assistant "
         "system").split()
SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}")


def _vocab() -> dict[str, int]:
    words = list(dict.fromkeys(WORDS))
    return {w: i for i, w in enumerate(words + SPECIALS)}


def _bf16(rng: random.Random, n: int) -> bytes:
    """``n`` bf16 values in +-[2**-7, 2**-6) (exponent 120, random sign and mantissa), little-endian."""
    lo = rng.randbytes(n).translate(bytes(b & 0x7F for b in range(256)))            # exponent's low bit 0
    hi = rng.randbytes(n).translate(bytes(0x3C | (b & 0x80) for b in range(256)))   # sign, exponent's high bits
    out = bytearray(2 * n)
    out[0::2], out[1::2] = lo, hi
    return bytes(out)


def _ones(n: int) -> bytes:
    return b"\x80\x3f" * n      # bf16 1.0


def _zeros(n: int, width: int = 2) -> bytes:
    return b"\0" * (n * width)


def _t(rng, *shape) -> tuple:
    n = 1
    for d in shape:
        n *= d
    return ("BF16", list(shape), _bf16(rng, n))


def text_config() -> dict:
    vocab = _vocab()
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": V,
        "hidden_size": H, "intermediate_size": DENSE_I, "moe_intermediate_size": MOE_I, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "n_shared_experts": 1,
        "n_routed_experts": EXPERTS, "num_experts_per_tok": TOPK, "routed_scaling_factor": 2.5,
        "kv_lora_rank": KV_LORA, "q_lora_rank": Q_LORA, "qk_rope_head_dim": ROPE, "qk_nope_head_dim": NOPE,
        "v_head_dim": V_HEAD, "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
        "norm_topk_prob": True, "first_k_dense_replace": 1, "moe_layer_freq": 1, "hidden_act": "silu",
        "max_position_embeddings": 8192, "rope_theta": 50000.0, "rope_scaling": None, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "attention_bias": False,
        "bos_token_id": vocab["<s>"], "eos_token_id": vocab["</s>"], "initializer_range": 0.02, "use_cache": True,
    }


def kimi_config() -> dict:
    vocab = _vocab()
    media = V - 48     # inside the vocabulary, past every token the tokenizer has
    return {
        "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "text_config": text_config(),
        "vision_config": {"patch_size": 14, "pos_emb_height": 8, "pos_emb_width": 8, "pos_emb_time": 4,
                          "num_attention_heads": 2, "num_hidden_layers": 1, "hidden_size": 64,
                          "intermediate_size": 128, "merge_kernel_size": [2, 2]},
        "projection_hidden_size": 64,
        # the hub's schema: vLLM < 0.34's EAGLE proposer reads media_placeholder_token_id (the drafter check asks)
        "media_placeholder_token_id": media, "image_token_id": media, "video_token_id": media + 1,
        "vision_start_token_id": media + 2, "vision_end_token_id": media + 3,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "bos_token_id": vocab["<s>"], "eos_token_id": vocab["</s>"],
    }


def _tokenizer_files(root: Path) -> None:
    vocab = _vocab()
    added = [{"id": vocab[s], "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for s in SPECIALS]
    (root / "tokenizer.json").write_text(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},     # words joined by spaces
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}, indent=1))
    (root / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "pad_token": "<unk>", "model_max_length": 8192, "chat_template": CHAT_TEMPLATE}, indent=1))
    (root / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>"}))


def target_tensors(seed: int = 0) -> dict:
    rng = random.Random(seed)
    p0 = "language_model."
    t = {p0 + "model.embed_tokens.weight": _t(rng, V, H),
         p0 + "model.norm.weight": ("BF16", [H], _zeros(H)),          # zero: every logit 0, greedy answers token 0
         p0 + "lm_head.weight": _t(rng, V, H)}
    for i in range(LAYERS):
        p = f"{p0}model.layers.{i}."
        t.update({p + "input_layernorm.weight": ("BF16", [H], _ones(H)),
                  p + "post_attention_layernorm.weight": ("BF16", [H], _ones(H)),
                  p + "self_attn.q_a_proj.weight": _t(rng, Q_LORA, H),
                  p + "self_attn.q_a_layernorm.weight": ("BF16", [Q_LORA], _ones(Q_LORA)),
                  p + "self_attn.q_b_proj.weight": _t(rng, HEADS * (NOPE + ROPE), Q_LORA),
                  p + "self_attn.kv_a_proj_with_mqa.weight": _t(rng, KV_LORA + ROPE, H),
                  p + "self_attn.kv_a_layernorm.weight": ("BF16", [KV_LORA], _ones(KV_LORA)),
                  p + "self_attn.kv_b_proj.weight": _t(rng, HEADS * (NOPE + V_HEAD), KV_LORA),
                  p + "self_attn.o_proj.weight": _t(rng, H, HEADS * V_HEAD)})
        if i == 0:
            t.update({p + "mlp.gate_proj.weight": _t(rng, DENSE_I, H), p + "mlp.up_proj.weight": _t(rng, DENSE_I, H),
                      p + "mlp.down_proj.weight": _t(rng, H, DENSE_I)})
            continue
        t[p + "mlp.gate.weight"] = _t(rng, EXPERTS, H)
        t[p + "mlp.gate.e_score_correction_bias"] = ("F32", [EXPERTS], _zeros(EXPERTS, 4))
        for j in range(EXPERTS):
            q = p + f"mlp.experts.{j}."
            t.update({q + "gate_proj.weight": _t(rng, MOE_I, H), q + "up_proj.weight": _t(rng, MOE_I, H),
                      q + "down_proj.weight": _t(rng, H, MOE_I)})
        t.update({p + "mlp.shared_experts.gate_proj.weight": _t(rng, MOE_I, H),
                  p + "mlp.shared_experts.up_proj.weight": _t(rng, MOE_I, H),
                  p + "mlp.shared_experts.down_proj.weight": _t(rng, H, MOE_I)})
    return t


def write_kimi_tiny(root: Path, shards: int = 4) -> Path:
    """The target checkpoint: config, ``shards`` safetensors files and their index, tokenizer and chat template."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(kimi_config(), indent=1))
    vocab = _vocab()
    (root / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": vocab["<s>"], "eos_token_id": vocab["</s>"], "max_new_tokens": 64}))
    _tokenizer_files(root)
    # what vLLM's fused Kimi-K2.5 processor reads (its processing info is built even for text only)
    (root / "preprocessor_config.json").write_text(json.dumps({"media_proc_cfg": {
        "patch_size": 14, "merge_kernel_size": [2, 2], "in_patch_limit": 1024, "patch_limit_on_one_side": 64,
        "fixed_output_tokens": None, "temporal_merge_kernel_size": 4, "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5], "in_patch_limit_each_frame": 256, "in_patch_limit_video": 4096}}, indent=1))
    tensors = target_tensors()
    names = sorted(tensors)
    per = -(-len(names) // shards)
    weight_map, total = {}, 0
    for s in range(shards):
        part = {n: tensors[n] for n in names[s * per:(s + 1) * per]}
        fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        (root / fn).write_bytes(safetensors_bytes(part))
        for n, (_dtype, _shape, raw) in part.items():
            weight_map[n] = fn
            total += len(raw)
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    return root


def drafter_config(hidden: int = H, mla: bool = False) -> dict:
    """A Llama EAGLE-3 drafter's config, or with ``mla`` an MLA one (``Eagle3DeepseekV2ForCausalLM``, vLLM's
    ``deepseek_eagle3.py``, Kimi's MLA dimensions): the drafter vLLM's CPU build can pair with an MLA target on a CPU
    without AMX (there the target's CPU_MLA backend takes only 16-token KV blocks and a Llama drafter's CPU_ATTN only
    multiples of 32: vLLM refuses the pair with "No common block size"; with AMX both run on blocks of 32)."""
    vocab = _vocab()
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
           "intermediate_size": DENSE_I, "num_attention_heads": HEADS, "num_key_value_heads": HEADS,
           "head_dim": 128, "num_hidden_layers": 1, "vocab_size": V, "draft_vocab_size": DRAFT_V,
           "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 50000.0, "torch_dtype": "bfloat16",
           "tie_word_embeddings": False, "hidden_act": "silu",
           "bos_token_id": vocab["<s>"], "eos_token_id": vocab["</s>"],
           "eagle_aux_hidden_state_layer_ids": AUX_LAYERS}
    if mla:
        del cfg["head_dim"]
        cfg.update({"architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
                    "kv_lora_rank": KV_LORA, "q_lora_rank": Q_LORA, "qk_rope_head_dim": ROPE,
                    "qk_nope_head_dim": NOPE, "v_head_dim": V_HEAD, "rope_scaling": None,
                    "n_routed_experts": EXPERTS, "num_experts_per_tok": TOPK, "moe_intermediate_size": MOE_I,
                    "first_k_dense_replace": 1})
    return cfg


def write_drafter(root: Path, hidden: int = H, seed: int = 1, mla: bool = False) -> Path:
    """An EAGLE-3 drafter (Llama, or with ``mla`` MLA: ``drafter_config``): agrees with ``write_kimi_tiny``'s target
    at ``hidden == H`` (module docstring: a zero final norm, it always proposes draft token 0); another ``hidden``
    makes the misfit one."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(drafter_config(hidden, mla), indent=1))
    h, q, i, p = hidden, HEADS * 128, DENSE_I, "midlayer."
    if mla:     # its one layer's input is 2 x hidden (the token's embedding beside the target's hidden state)
        t = {p + "self_attn.q_a_proj.weight": _t(rng, Q_LORA, 2 * h),
             p + "self_attn.q_a_layernorm.weight": ("BF16", [Q_LORA], _ones(Q_LORA)),
             p + "self_attn.q_b_proj.weight": _t(rng, HEADS * (NOPE + ROPE), Q_LORA),
             p + "self_attn.kv_a_proj_with_mqa.weight": _t(rng, KV_LORA + ROPE, 2 * h),
             p + "self_attn.kv_a_layernorm.weight": ("BF16", [KV_LORA], _ones(KV_LORA)),
             p + "self_attn.kv_b_proj.weight": _t(rng, HEADS * (NOPE + V_HEAD), KV_LORA),
             p + "self_attn.o_proj.weight": _t(rng, h, HEADS * V_HEAD)}
    else:
        t = {p + "self_attn.q_proj.weight": _t(rng, q, 2 * h), p + "self_attn.k_proj.weight": _t(rng, q, 2 * h),
             p + "self_attn.v_proj.weight": _t(rng, q, 2 * h), p + "self_attn.o_proj.weight": _t(rng, h, q)}
    t.update({p + "mlp.gate_proj.weight": _t(rng, i, h), p + "mlp.up_proj.weight": _t(rng, i, h),
              p + "mlp.down_proj.weight": _t(rng, h, i),
              p + "input_layernorm.weight": ("BF16", [h], _ones(h)),
              p + "hidden_norm.weight": ("BF16", [h], _ones(h)),
              p + "post_attention_layernorm.weight": ("BF16", [h], _ones(h)),
              "fc.weight": _t(rng, h, 3 * h),
              "norm.weight": ("BF16", [h], _zeros(h)),                 # zero: every draft logit 0, proposes token 0
              "lm_head.weight": _t(rng, DRAFT_V, h),
              "d2t": ("I64", [DRAFT_V], _zeros(DRAFT_V, 8)),            # draft token k -> target token k + d2t[k]
              "t2d": ("BOOL", [V], b"\x01" * DRAFT_V + b"\0" * (V - DRAFT_V))})
    (root / "model.safetensors").write_bytes(safetensors_bytes(t))
    return root
