"""SANDBOX: the simulated checkpoints - a Kimi-K2.5-shaped model directory (real config.json, real safetensors
files of 16 bytes each in place of ~9.8 GB shards) and the EAGLE-3 drafter of AQ-MedAI/Kimi-K25-eagle3 (its real
config and a header-true safetensors file).  Pure file writing: no host, no state directory."""
from __future__ import annotations

import json
import os
from pathlib import Path


def kimi_config(num_layers: int = 61) -> dict:
    """A Kimi-K2.5-shaped config.json (vLLM's KimiK25Config reads text_config as DeepseekV3Config)."""
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config",
                     "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration"},
        "bos_token_id": 163584, "eos_token_id": 163585, "pad_token_id": 163839,
        "media_placeholder_token_id": 163605,
        "text_config": {
            "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
            "num_hidden_layers": num_layers, "hidden_size": 7168, "intermediate_size": 18432,
            "moe_intermediate_size": 2048, "n_routed_experts": 384, "num_experts_per_tok": 8,
            "n_shared_experts": 1, "first_k_dense_replace": 1, "num_attention_heads": 64,
            "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "vocab_size": 163840, "max_position_embeddings": 262144, "rms_norm_eps": 1e-5,
            "rope_theta": 50000.0, "torch_dtype": "bfloat16",
            "bos_token_id": 163584, "eos_token_id": 163585,
        },
        "vision_config": {"patch_size": 14, "init_pos_emb_height": 64, "init_pos_emb_width": 64,
                          "num_attention_heads": 16, "num_hidden_layers": 27, "hidden_size": 1152,
                          "intermediate_size": 4304, "merge_kernel_size": [2, 2]},
        "torch_dtype": "bfloat16",
    }


def drafter_config() -> dict:
    """Shape of AQ-MedAI/Kimi-K25-eagle3 (LlamaForCausalLMEagle3)."""
    return {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 1,
        "num_attention_heads": 64, "num_key_value_heads": 64, "head_dim": 128,
        "vocab_size": 163840, "draft_vocab_size": 32000, "max_position_embeddings": 262144,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58], "use_aux_hidden_state": True},
    }


def safetensors_bytes(tensors: dict) -> bytes:
    """A safetensors file (8-byte little-endian header length, JSON header, the tensors' bytes): name -> (dtype,
    shape, data).  The format: https://github.com/huggingface/safetensors#format"""
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)     # the header is padded with spaces to 8 bytes, as the library writes it
    return len(h).to_bytes(8, "little") + h + data


DTYPE_BYTES = {"BF16": 2, "F32": 4, "I32": 4, "I64": 8, "BOOL": 1}


def kimi_shards(cfg: dict | None = None) -> list[dict]:
    """SANDBOX: the tensors of Kimi-K2.5's INT4 checkpoint, one dict {name: (dtype, shape)} per shard (64): names as
    the hub's checkpoint has them under ``language_model.``, shapes from the config; the routed experts packed INT4
    (compressed-tensors pack-quantized, group size 32: ``weight_packed`` int32 [out, in/8], ``weight_scale`` bf16
    [out, in/32], ``weight_shape``), everything else bf16 (docs/sandbox.md).  Shard 1 holds the embedding and the
    dense layer 0, shards 2-61 one MoE layer each (~9.8 GB), 62 the vision tower, 63 the projector, 64 the head."""
    c = cfg or kimi_config()
    t, v = c["text_config"], c["vision_config"]
    h, inter, moe = t["hidden_size"], t["intermediate_size"], t["moe_intermediate_size"]
    heads, qr, kvr = t["num_attention_heads"], t["q_lora_rank"], t["kv_lora_rank"]
    nope, rope, vd = t["qk_nope_head_dim"], t["qk_rope_head_dim"], t["v_head_dim"]
    bf = "BF16"

    def layer(i):
        p = f"language_model.model.layers.{i}."
        out = {p + "input_layernorm.weight": (bf, [h]), p + "post_attention_layernorm.weight": (bf, [h]),
               p + "self_attn.q_a_proj.weight": (bf, [qr, h]), p + "self_attn.q_a_layernorm.weight": (bf, [qr]),
               p + "self_attn.q_b_proj.weight": (bf, [heads * (nope + rope), qr]),
               p + "self_attn.kv_a_proj_with_mqa.weight": (bf, [kvr + rope, h]),
               p + "self_attn.kv_a_layernorm.weight": (bf, [kvr]),
               p + "self_attn.kv_b_proj.weight": (bf, [heads * (nope + vd), kvr]),
               p + "self_attn.o_proj.weight": (bf, [h, heads * vd])}
        if i < t["first_k_dense_replace"]:
            for proj, shape in (("gate_proj", [inter, h]), ("up_proj", [inter, h]), ("down_proj", [h, inter])):
                out[f"{p}mlp.{proj}.weight"] = (bf, shape)
            return out
        out[p + "mlp.gate.weight"] = (bf, [t["n_routed_experts"], h])
        out[p + "mlp.gate.e_score_correction_bias"] = ("F32", [t["n_routed_experts"]])
        shared = moe * t["n_shared_experts"]
        for proj, shape in (("gate_proj", [shared, h]), ("up_proj", [shared, h]), ("down_proj", [h, shared])):
            out[f"{p}mlp.shared_experts.{proj}.weight"] = (bf, shape)
        for e in range(t["n_routed_experts"]):
            for proj, (o, i_) in (("gate_proj", (moe, h)), ("up_proj", (moe, h)), ("down_proj", (h, moe))):
                q = f"{p}mlp.experts.{e}.{proj}."
                out[q + "weight_packed"] = ("I32", [o, i_ // 8])
                out[q + "weight_scale"] = (bf, [o, i_ // 32])
                out[q + "weight_shape"] = ("I32", [2])
        return out

    vh, vi = v["hidden_size"], v["intermediate_size"]
    tower = {"vision_tower.patch_embed.proj.weight": (bf, [vh, 3, v["patch_size"], v["patch_size"]]),
             "vision_tower.patch_embed.pos_emb.weight": (bf, [v["init_pos_emb_height"], v["init_pos_emb_width"], vh])}
    for b in range(v["num_hidden_layers"]):
        p = f"vision_tower.encoder.blocks.{b}."
        tower.update({p + "wqkv.weight": (bf, [3 * vh, vh]), p + "wo.weight": (bf, [vh, vh]),
                      p + "mlp.fc0.weight": (bf, [vi, vh]), p + "mlp.fc1.weight": (bf, [vh, vi]),
                      p + "norm0.weight": (bf, [vh]), p + "norm1.weight": (bf, [vh])})
    merged = vh * v["merge_kernel_size"][0] * v["merge_kernel_size"][1]
    projector = {"mm_projector.pre_norm.weight": (bf, [vh]), "mm_projector.proj.0.weight": (bf, [merged, merged]),
                 "mm_projector.proj.2.weight": (bf, [h, merged])}
    first = {"language_model.model.embed_tokens.weight": (bf, [t["vocab_size"], h]), **layer(0)}
    head = {"language_model.model.norm.weight": (bf, [h]), "language_model.lm_head.weight": (bf, [t["vocab_size"], h])}
    return [first] + [layer(i) for i in range(1, t["num_hidden_layers"])] + [tower, projector, head]


def _header_bytes(tensors: dict) -> tuple[bytes, int]:
    """(the 8-byte length + JSON header, the data's length) of a safetensors file holding ``tensors``."""
    header, off = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = DTYPE_BYTES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)     # the header is padded with spaces to 8 bytes, as the library writes it
    return len(h).to_bytes(8, "little") + h, off


def write_model_dir(root: Path, shards: int = 64, header_true: bool = False) -> None:
    """A Kimi-K2.5-shaped checkpoint.  ``header_true`` (what the sandbox hosts get): the 64 shards of the real INT4
    checkpoint, every tensor's name, dtype, shape and offsets in its header and the file as long as the header says
    (~595 GB), sparse: the data are holes, a few MB on disk; the preflight's shard check and memory plan read what
    they would read on a real host.  Otherwise ``shards`` files of one 16-byte tensor each (the engines' own
    parsers in tests only read config.json)."""
    root.mkdir(parents=True, exist_ok=True)
    cfg = kimi_config()
    (root / "config.json").write_text(json.dumps(cfg, indent=2))
    # SANDBOX: the real checkpoint ships Moonshot's configuration_kimi_k25.py (config.json's auto_map names it;
    # SGLang loads it with --trust-remote-code).  This one re-exports the serving engine's own copy of the class.
    (root / "configuration_kimi_k25.py").write_text(
        "# SANDBOX stand-in for the checkpoint's own file: the installed engine's KimiK25Config.\n"
        "try:\n    from sglang.srt.configs.kimi_k25 import KimiK25Config  # noqa: F401\n"
        "except ImportError:\n    from vllm.transformers_utils.configs.kimi_k25 import KimiK25Config  # noqa: F401\n")
    (root / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 262144}))
    if header_true:
        contents = kimi_shards(cfg)
        shards = len(contents)
    else:
        contents = [{f"language_model.model.layers.{i}.mlp.experts.weight": ("BF16", [8])} for i in range(shards)]
    names = [f"model-{i:05d}-of-{shards:06d}.safetensors" for i in range(1, shards + 1)]
    weight_map, total = {}, 0
    for name, tensors in zip(names, contents, strict=True):
        head, data = _header_bytes(tensors)
        with open(root / name, "wb") as f:
            f.write(head)
            f.truncate(len(head) + data)      # sparse: the tensors' bytes are a hole
        weight_map.update((t, name) for t in tensors)
        total += data
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, separators=(",", ":")))


def drafter_tensors(cfg: dict | None = None, fc_in: int | None = None) -> dict:
    """The tensors of AQ-MedAI/Kimi-K25-eagle3 (LlamaForCausalLMEagle3): names and shapes as the checkpoint has
    them, so that the drafter check reads what it would read on a real host."""
    c = cfg or drafter_config()
    h, heads, kv, hd, inter = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], \
        c["intermediate_size"]
    return {"fc.weight": ("BF16", [h, fc_in or 3 * h]), "d2t": ("I64", [c["draft_vocab_size"]]),
            "t2d": ("BOOL", [c["vocab_size"]]), "lm_head.weight": ("BF16", [c["draft_vocab_size"], h]),
            "norm.weight": ("BF16", [h]), "midlayer.input_layernorm.weight": ("BF16", [h]),
            "midlayer.hidden_norm.weight": ("BF16", [h]),
            "midlayer.self_attn.q_proj.weight": ("BF16", [heads * hd, 2 * h]),
            "midlayer.self_attn.k_proj.weight": ("BF16", [kv * hd, 2 * h]),
            "midlayer.self_attn.v_proj.weight": ("BF16", [kv * hd, 2 * h]),
            "midlayer.self_attn.o_proj.weight": ("BF16", [h, heads * hd]),
            "midlayer.post_attention_layernorm.weight": ("BF16", [h]),
            "midlayer.mlp.gate_proj.weight": ("BF16", [inter, h]), "midlayer.mlp.up_proj.weight": ("BF16", [inter, h]),
            "midlayer.mlp.down_proj.weight": ("BF16", [h, inter])}


def drafter_weights_bytes(tensors: dict, data_bytes: int = 1 << 20) -> bytes:
    """SANDBOX: a safetensors file whose header is the real checkpoint's (names, dtypes, shapes, offsets), followed
    by ``data_bytes`` of random data instead of ~2.4 GB: the drafter check and the memory plan read only the header;
    nothing loads it (it is shipped to every host, so it is not sparse)."""
    head, _ = _header_bytes(tensors)
    return head + os.urandom(data_bytes)


def write_drafter_dir(root: Path, fc_in: int | None = None) -> Path:
    """The drafter checkpoint on the *controller* (the operator's machine), shipped by the drafter role: its real
    config and a header-true safetensors file (``fc_in``: another fc input size, for a drafter that does not fit)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(drafter_config(), indent=2))
    weights = root / "model.safetensors"
    want = drafter_tensors(fc_in=fc_in)
    try:
        from deployer.drafter_fit import safetensors_shapes
        current = safetensors_shapes(weights)
    except (OSError, ValueError):
        current = None
    if current != {k: v[1] for k, v in want.items()}:   # kept when it is already this one (its hash is cached)
        weights.write_bytes(drafter_weights_bytes(want))
    return root
