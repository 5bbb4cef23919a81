"""Does the EAGLE-3 drafter fit its target, as the INSTALLED engine will wire them?  Checked before anything
restarts (preflight, on the controller), from config.json files and the drafter's safetensors header only: no torch.

Why (docs/real-engine.md, the ``bad_drafter`` run on an H200): the target captures the hidden states of the layers
the drafter's config names -- where the engine looks for them -- and the drafter's ``fc`` takes exactly
(distinct captured layers x target hidden size) inputs.  A mismatch passes every check and ``/health``, then kills
the engine on the first request (``mat1 and mat2 shapes cannot be multiplied``): a 25-minute load, then a
25-minute rollback.

Where each engine reads the layer ids (read in the installed source; the versions the deployer supports):

* vLLM 0.16 - 0.20 (``gpu_model_runner.py``: ``hf_config.eagle_aux_hidden_state_layer_ids`` of the draft model's
  config, top level only; else the target's ``get_eagle3_aux_hidden_state_layers()``: ``(2, L // 2, L - 3)``).
  The drafter's ``fc`` is built as ``3 x (target_hidden_size or hidden_size)`` (``llama_eagle3.py``).  From 0.22
  the runner falls back to ``eagle_config``'s ids and the drafter sizes ``fc`` by their count
  (``deployer/engines/vllm.py``, measured by ``bench/compat_matrix.py``).
* SGLang 0.5.23 (``spec_aux_hidden_state.py``: ``eagle_config["eagle_aux_hidden_state_layer_ids"]``, nested only;
  ``deepseek_v2.set_eagle3_layers_to_capture``: ids starting at 1 are shifted by +1; none: ``[2, L // 2, L - 3]``).
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

from deployer.host.module_utils.safetensors_header import size_int

# EAGLE-3.1 config flags no supported engine release reads: a drafter trained with them behaves differently here
IGNORED_FLAGS = ("fc_norm", "norm_output", "norm_before_residual")


class DrafterFitError(ValueError):
    pass


def _header(path: Path) -> dict:
    """{tensor name: (shape, data_offsets)} from a safetensors file's header (8-byte little-endian length, then
    JSON), each checked."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise DrafterFitError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
        (n,) = struct.unpack("<Q", head)
        if n > 100 << 20:
            raise DrafterFitError(f"{path}: safetensors header of {n} bytes claimed; expected < 100 MiB")
        try:
            header = json.loads(f.read(n))
        except (ValueError, RecursionError) as e:      # RecursionError: nested beyond reason
            raise DrafterFitError(f"{path}: safetensors header is not JSON ({type(e).__name__})") from e
    if not isinstance(header, dict):
        raise DrafterFitError(f"{path}: safetensors header is a JSON {type(header).__name__}, expected an object")
    out = {}
    for k, v in header.items():
        if k == "__metadata__" or not isinstance(v, dict):
            continue
        shape, offsets = v.get("shape"), v.get("data_offsets")
        if not (isinstance(shape, list) and all(size_int(x) for x in shape)):
            raise DrafterFitError(f"{path}: tensor {k[:80]!r}: shape {str(shape)[:80]} is not a list of integers")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(size_int(x) for x in offsets)
                and offsets[0] <= offsets[1]):
            raise DrafterFitError(f"{path}: tensor {k[:80]!r}: data_offsets is not two ascending non-negative "
                                  "integers")
        out[k] = (shape, offsets)
    return out


def safetensors_shapes(path: Path) -> dict:
    """{tensor name: shape} from a safetensors file's header."""
    return {k: shape for k, (shape, _) in _header(path).items()}


def _files(d: Path) -> list[str]:
    index = d / "model.safetensors.index.json"
    return sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else \
        [p.name for p in sorted(d.glob("*.safetensors"))]


def read_drafter(src_dir: str) -> tuple[dict, dict]:
    """(config.json, {tensor: shape}) of the drafter checkpoint on the controller."""
    d = Path(src_dir)
    cfg = json.loads((d / "config.json").read_text())
    shapes: dict = {}
    for name in _files(d):
        shapes.update(safetensors_shapes(d / name))
    return cfg, shapes


def tensor_bytes(src_dir: str) -> int:
    """The bytes the drafter's tensors take, by their headers' data_offsets (what the engine loads onto the GPUs)."""
    d = Path(src_dir)
    return sum(o[1] - o[0] for name in _files(d) for _, o in _header(d / name).values())


def text_config(target_cfg: dict) -> dict:
    """The language model's config: Kimi-K2.5 wraps a DeepSeek-V3 in ``text_config``."""
    return target_cfg.get("text_config") or target_cfg


def _tensor(shapes: dict, suffix: str):
    hits = [k for k in shapes if k == suffix or k.endswith("." + suffix)]
    return (hits[0], shapes[hits[0]]) if hits else (None, None)


def captured_layers(engine: str, drafter_cfg: dict, num_layers: int, version: str = "") -> tuple[list[int], str]:
    """The target layers the installed engine release will capture for this drafter, and where it took them from
    (the engine's own rule: deployer/engines)."""
    from deployer import engines
    return engines.get(engine).aux_layers(drafter_cfg, num_layers, version)


def check(target_cfg: dict, drafter_cfg: dict, shapes: dict, engine: str = "vllm", version: str = "") -> dict:
    """{refusals, warnings, captured, source, fc_in, expected_fc_in}: each refusal and warning names the measured
    and the expected value.  Pure."""
    tc = text_config(target_cfg)
    L, H = int(tc.get("num_hidden_layers") or 0), int(tc.get("hidden_size") or 0)
    from deployer import engines
    eng = engines.get(engine)
    label = f"{eng.label} {version}".strip()
    refusals, warnings = [], []
    ids, source = captured_layers(engine, drafter_cfg, L, version)
    outside = [i for i in ids if not 0 <= i < L]
    if outside:
        refusals.append(f"drafter: aux layers {outside} (from {source}) are outside the target's {L} layers")
    captured = sorted({i for i in ids if 0 <= i < L})
    if len(captured) < len(ids) and not outside:
        warnings.append(f"drafter: aux layers {ids} name {len(ids) - len(captured)} layer(s) twice; the target "
                        f"captures each once ({captured})")
    fc_name, fc = _tensor(shapes, "fc.weight")
    fc_in = fc[1] if fc and len(fc) == 2 else None
    expected = len(captured) * H
    if fc_name is None:
        refusals.append("drafter: no fc.weight in its safetensors (an EAGLE-3 drafter's input projection); "
                        f"tensors: {sorted(shapes)[:8]}")
    elif fc_in != expected:
        refusals.append(
            f"drafter: fc.weight takes {fc_in} inputs, but {label} will capture target layers {captured} (from "
            f"{source}) of hidden size {H}: expected {len(captured)} x {H} = {expected}; the engine would load, "
            "pass /health, then die on the first request ('mat1 and mat2 shapes cannot be multiplied')")
    exported = eng.exported_elsewhere(drafter_cfg, version)
    if exported and [int(i) for i in exported] != ids:
        warnings.append(f"drafter: its config also names aux layers {list(exported)} where {label} does not read "
                        f"them; it will capture {ids} ({source})")
    tgt_hidden = drafter_cfg.get("target_hidden_size")
    if tgt_hidden is not None and int(tgt_hidden) != H:
        refusals.append(f"drafter: target_hidden_size {tgt_hidden}, the target's hidden size is {H}")
    built = eng.built_fc_inputs(drafter_cfg, version)
    if built is not None and fc_in is not None and fc_in != built:
        refusals.append(f"drafter: fc.weight takes {fc_in} inputs; {label} builds the drafter's fc for {built} "
                        "inputs from its config (its weights would not load)")
    if fc and len(fc) == 2 and drafter_cfg.get("hidden_size") and fc[0] != int(drafter_cfg["hidden_size"]):
        refusals.append(f"drafter: fc.weight gives {fc[0]} outputs, its hidden_size is {drafter_cfg['hidden_size']}")
    vocab = int(tc.get("vocab_size") or 0)
    draft_vocab = int(drafter_cfg.get("draft_vocab_size") or drafter_cfg.get("vocab_size") or 0)
    _n, d2t = _tensor(shapes, "d2t")
    _n, t2d = _tensor(shapes, "t2d")
    if d2t is not None and d2t != [draft_vocab]:
        refusals.append(f"drafter: d2t has shape {d2t}, expected [draft_vocab_size] = [{draft_vocab}]")
    if d2t is not None and vocab and draft_vocab == vocab and not eng.loads_d2t_at_full_vocab(version):
        refusals.append(f"drafter: ships d2t although its draft_vocab_size {draft_vocab} is the target's whole "
                        f"vocabulary; {label} builds no draft_id_to_target_id then and refuses the checkpoint at load "
                        "(after the target's weights): drop d2t and t2d from its safetensors (the map is the "
                        "identity) or use vLLM < 0.30")
    if t2d is not None and vocab and t2d != [vocab]:
        refusals.append(f"drafter: t2d has shape {t2d}, expected [target vocab_size] = [{vocab}]")
    if drafter_cfg.get("vocab_size") and vocab and int(drafter_cfg["vocab_size"]) != vocab:
        refusals.append(f"drafter: vocab_size {drafter_cfg['vocab_size']}, the target's is {vocab}")
    _n, lm = _tensor(shapes, "lm_head.weight")
    if lm is not None and draft_vocab and lm[0] != draft_vocab:
        refusals.append(f"drafter: lm_head.weight has {lm[0]} rows, expected draft_vocab_size {draft_vocab}")
    for field in eng.proposer_reads(target_cfg, version):
        if target_cfg.get(field) is None:
            refusals.append(f"target config: no {field}; {label}'s EAGLE proposer reads it from a "
                            f"{'/'.join(target_cfg.get('architectures') or [])} target when it loads the drafter, "
                            "after the target's weights (the load would die at its end); the hub's config has it (the "
                            "image placeholder token id: image_token_id in transformers' schema)"
                            + (f" = {target_cfg['image_token_id']}?" if target_cfg.get("image_token_id") is not None
                               else ""))
    for flag in IGNORED_FLAGS:
        if drafter_cfg.get(flag) or (drafter_cfg.get("eagle_config") or {}).get(flag):
            warnings.append(f"drafter: {flag} is set (an EAGLE-3.1 export); {label} ignores it, so the drafter "
                            "runs without it and its acceptance may be lower than trained")
    return {"refusals": refusals, "warnings": warnings, "captured": captured, "source": source, "fc_in": fc_in,
            "expected_fc_in": expected}
