"""Tiny checkpoints of the real architectures for the real-engine bench (bench/real_engine/harness.py): a
DeepSeek-V3 target (Kimi-K2.5's language model: MLA with kv_lora_rank 512 / rope 64, 16 routed experts top-4,
noaux_tc sigmoid routing, first layer dense) in N safetensors shards, an EAGLE-3 Llama drafter (fc 3 x hidden,
d2t/t2d), a byte-level BPE tokenizer with a chat template.  Random weights; tensor names and shapes as the HF
checkpoints name them.  Needs torch, safetensors and tokenizers (the GPU machine has them).

Kimi-K2.5's own wrapper (KimiK25ForConditionalGeneration) is not made: vLLM builds its processing info with
cached_get_image_processor(model, trust_remote_code=...) (vllm/model_executor/models/kimi_k25.py), i.e. the
checkpoint's own image-processor code, which a tiny checkpoint cannot ship faithfully (docs/real-engine.md).

    python bench/real_engine/make_models.py /root/m     # target/ (8 shards), target_big/ (32), drafter/
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

root = sys.argv[1]
H, V, L = 1024, 4096, 6
HEADS, QL, KVL, NOPE, ROPE, VD = 8, 384, 512, 128, 64, 128
E, TOPK, MOEI, I = 16, 4, 256, 2048
SHARDS = int(os.environ.get("SHARDS", "8"))
g = torch.Generator().manual_seed(0)
def w(*s): return (torch.randn(*s, generator=g) * 0.02).to(torch.bfloat16)
def ones(n): return torch.ones(n, dtype=torch.bfloat16)

def tokenizer(d):
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    words = ("the model loads its weights shard by shard then compiles graphs and captures them "
             "a drafter proposes tokens the target verifies them speculative decoding accepts some "
             "reply with one short sentence what is served here hello world deploy rollback health").split()
    corpus = [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 20
    specials = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=1500, special_tokens=specials,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(f"{d}/tokenizer.json")
    tmpl = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
               "unk_token": "<unk>", "pad_token": "<unk>", "model_max_length": 8192, "chat_template": tmpl},
              open(f"{d}/tokenizer_config.json", "w"))
    json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
              open(f"{d}/special_tokens_map.json", "w"))
    return tok.token_to_id("<s>"), tok.token_to_id("</s>")

def target(d, shards):
    os.makedirs(d, exist_ok=True)
    bos, eos = tokenizer(d)
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": V,
           "hidden_size": H, "intermediate_size": I, "moe_intermediate_size": MOEI, "num_hidden_layers": L,
           "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "n_shared_experts": 1,
           "n_routed_experts": E, "num_experts_per_tok": TOPK, "routed_scaling_factor": 2.5,
           "kv_lora_rank": KVL, "q_lora_rank": QL, "qk_rope_head_dim": ROPE, "qk_nope_head_dim": NOPE,
           "v_head_dim": VD, "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
           "norm_topk_prob": True, "first_k_dense_replace": 1, "moe_layer_freq": 1, "hidden_act": "silu",
           "max_position_embeddings": 8192, "rope_theta": 50000.0, "rope_scaling": None, "rms_norm_eps": 1e-6,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": bos, "eos_token_id": eos,
           "attention_bias": False, "initializer_range": 0.02, "use_cache": True}
    json.dump(cfg, open(f"{d}/config.json", "w"), indent=1)
    json.dump({"bos_token_id": bos, "eos_token_id": eos, "max_new_tokens": 64},
              open(f"{d}/generation_config.json", "w"))
    t = {"model.embed_tokens.weight": w(V, H), "model.norm.weight": ones(H), "lm_head.weight": w(V, H)}
    for i in range(L):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": ones(H), p + "post_attention_layernorm.weight": ones(H),
                  p + "self_attn.q_a_proj.weight": w(QL, H), p + "self_attn.q_a_layernorm.weight": ones(QL),
                  p + "self_attn.q_b_proj.weight": w(HEADS * (NOPE + ROPE), QL),
                  p + "self_attn.kv_a_proj_with_mqa.weight": w(KVL + ROPE, H),
                  p + "self_attn.kv_a_layernorm.weight": ones(KVL),
                  p + "self_attn.kv_b_proj.weight": w(HEADS * (NOPE + VD), KVL),
                  p + "self_attn.o_proj.weight": w(H, HEADS * VD)})
        if i == 0:
            t.update({p + "mlp.gate_proj.weight": w(I, H), p + "mlp.up_proj.weight": w(I, H),
                      p + "mlp.down_proj.weight": w(H, I)})
        else:
            t[p + "mlp.gate.weight"] = w(E, H)
            t[p + "mlp.gate.e_score_correction_bias"] = torch.zeros(E, dtype=torch.float32)
            for j in range(E):
                q = p + f"mlp.experts.{j}."
                t.update({q + "gate_proj.weight": w(MOEI, H), q + "up_proj.weight": w(MOEI, H),
                          q + "down_proj.weight": w(H, MOEI)})
            t.update({p + "mlp.shared_experts.gate_proj.weight": w(MOEI, H),
                      p + "mlp.shared_experts.up_proj.weight": w(MOEI, H),
                      p + "mlp.shared_experts.down_proj.weight": w(H, MOEI)})
    names = sorted(t)
    per = -(-len(names) // shards)
    wmap, total = {}, 0
    for s in range(shards):
        part = {n: t[n].contiguous() for n in names[s * per:(s + 1) * per]}
        fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, f"{d}/{fn}", metadata={"format": "pt"})
        for n, x in part.items():
            wmap[n] = fn; total += x.numel() * x.element_size()
    json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, open(f"{d}/model.safetensors.index.json", "w"))

def drafter(d, h=H):
    os.makedirs(d, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": h,
           "intermediate_size": I, "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "head_dim": 128,
           "num_hidden_layers": 1, "vocab_size": V, "draft_vocab_size": V, "max_position_embeddings": 8192,
           "rms_norm_eps": 1e-6, "rope_theta": 50000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
           "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
           # top level: where vLLM reads them (gpu_model_runner.py); the drafter check (deployer/drafter_fit.py)
           # refuses this drafter for SGLang, which reads only eagle_config's
           "eagle_aux_hidden_state_layer_ids": [1, 3, 4]}
    if h != H:
        cfg["target_hidden_size"] = H + 512   # wrong on purpose: the fc input does not match the target
    json.dump(cfg, open(f"{d}/config.json", "w"), indent=1)
    q = HEADS * 128
    t = {"midlayer.self_attn.q_proj.weight": w(q, 2 * h), "midlayer.self_attn.k_proj.weight": w(q, 2 * h),
         "midlayer.self_attn.v_proj.weight": w(q, 2 * h), "midlayer.self_attn.o_proj.weight": w(h, q),
         "midlayer.mlp.gate_proj.weight": w(I, h), "midlayer.mlp.up_proj.weight": w(I, h),
         "midlayer.mlp.down_proj.weight": w(h, I), "midlayer.input_layernorm.weight": ones(h),
         "midlayer.hidden_norm.weight": ones(h), "midlayer.post_attention_layernorm.weight": ones(h),
         "fc.weight": w(h, 3 * h), "norm.weight": ones(h), "lm_head.weight": w(V, h),
         "d2t": torch.zeros(V, dtype=torch.int64), "t2d": torch.ones(V, dtype=torch.bool)}
    save_file(t, f"{d}/model.safetensors", metadata={"format": "pt"})

target(f"{root}/target", SHARDS)
target(f"{root}/target_big", 32)       # many shards: the loaders' progress lines (prefetch, multi-thread)
drafter(f"{root}/drafter")
print("models made:", sorted(os.listdir(root)))
