#!/usr/bin/env python3
"""The GPU canary: what a load would meet on these GPUs in its first minutes, in seconds and before the restart.

Run by the release venv's Python as the service user, in a transient unit with the server unit's own properties
(roles/canary).  Host code: the standard library here; torch, Triton and the engine only inside a rank.  It judges
nothing: it reports what each rank reached and measured, and the controller judges (deployer/canary.py).

  gpu_canary.py --world 8 --timeout-s 180 [--probe vllm_marlin_repack ...]

starts one rank per GPU (``--rank-program``: another program that speaks the same lines, the sandbox's stand-in),
reads their progress lines, stops them all at the time limit, and prints one report line:

  DEPLOYER-CANARY {"world": 8, "timed_out": false, "ranks": [{"rank": 0, "steps": {"cuda": {...}, ...}}, ...]}

A rank prints one JSON line per step (``{"rank": 0, "step": "cuda", "ok": true, ...}``), in this order:

  cuda      CUDA init on its GPU (torch.cuda.set_device, mem_get_info): name, compute capability, free/total MiB
  memory    whether the live server leaves this canary its room (``--min-free-mib``); a rank stops here if not
  nccl_init about to join the NCCL group (every rank must print it: one that never does is a rank that never joins)
  nccl      init_process_group + an all-reduce of ``--allreduce-mib`` checked for its sum, then timed (bus GB/s)
  triton    one Triton kernel compiled and run (the compiler, Python.h and Triton's cache as the server has them)
  probe     each of the release's own kernels asked for (``--probe``): the code a PTX-only build JIT-compiles
  done      the rank finished
"""
from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time

PREFIX = "DEPLOYER-CANARY "


def emit(rank: int, step: str, ok: bool = True, **kw) -> None:
    print(json.dumps({"rank": rank, "step": step, "ok": ok, **kw}), flush=True)


def _error(e: BaseException) -> str:
    return f"{type(e).__module__}.{type(e).__qualname__}: {e}".replace("builtins.", "")[:2000]


# ----------------------------------------------------------------------------------------------- one rank (torch)
def _triton_add(torch):
    import triton
    import triton.language as tl

    @triton.jit
    def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

    x = torch.arange(4096, device="cuda", dtype=torch.float32)
    out = torch.empty_like(x)
    add[(4,)](x, x, out, x.numel(), BLOCK=1024)
    torch.cuda.synchronize()
    if not torch.equal(out, x * 2):
        raise AssertionError("Triton's add kernel returned a wrong sum")
    return {"triton": triton.__version__}


def by_signature(fn, supplied: dict) -> dict:
    """The arguments of ``supplied`` that ``fn`` declares; TypeError (a release this canary does not know, so the
    probe is skipped, not failed) when it declares a required one that is not supplied."""
    import inspect
    params = inspect.signature(fn).parameters
    missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in supplied]
    if missing:
        raise TypeError(f"{getattr(fn, '__name__', fn)} asks for {', '.join(missing)}, which the canary does not "
                        "supply")
    return {n: v for n, v in supplied.items() if n in params}


def _repack_args(ops, torch, q, k: int, n: int) -> dict:
    """gptq_marlin_repack's arguments as the installed release declares them (0.16/0.18 take a perm tensor, empty
    without act-order; 0.33 does not)."""
    return by_signature(ops.gptq_marlin_repack, {"b_q_weight": q, "perm": torch.empty(0, dtype=torch.int32,
                        device="cuda"), "size_k": k, "size_n": n, "num_bits": 4})


def _probe_vllm_marlin_repack(torch):
    """vLLM's _C: gptq_marlin_repack, which repacks Kimi-K2.5's INT4 expert weights at load (signature of the
    installed release: 0.16 takes a perm tensor, 0.33 does not)."""
    from vllm import _custom_ops as ops
    k, n = 128, 256
    q = torch.zeros((k // 8, n), dtype=torch.int32, device="cuda")
    out = ops.gptq_marlin_repack(**_repack_args(ops, torch, q, k, n))
    torch.cuda.synchronize()
    return {"shape": list(out.shape)}


def _probe_vllm_moe_topk(torch):
    """vLLM's _moe_C: topk_softmax, the router of every MoE layer."""
    from vllm import _custom_ops as ops
    tokens, experts, k = 4, 384, 8
    w = torch.empty((tokens, k), dtype=torch.float32, device="cuda")
    ids = torch.empty((tokens, k), dtype=torch.int32, device="cuda")
    idx = torch.empty((tokens, k), dtype=torch.int32, device="cuda")
    ops.topk_softmax(w, ids, idx, torch.randn((tokens, experts), dtype=torch.float32, device="cuda"))
    torch.cuda.synchronize()
    return {"experts": experts, "topk": k}


def marlin_moe_case(torch, device, experts=8, tokens=16, top_k=2, size_k=256, size_n=256, group=32, block=16):
    """A small MoE GEMM in Kimi-K2.5's format (INT4 uint4b8 weights, groups of 32, bf16 activations) whose answer
    needs no knowledge of Marlin's layouts: every nibble of expert e is 9 + e % 4 (a weight of 1 + e % 4 after the
    bias of 8) and every scale the same, so row t*top_k + j of the result is (1 + e % 4) x scale x sum(x[t]) for
    e = topk_ids[t, j].  The routing (sorted_token_ids, expert_ids, padded to ``block``) is built here as vLLM's
    moe_align_block_size builds it, in torch (that op's signature differs between releases too)."""
    g = torch.Generator().manual_seed(0)
    x = (torch.rand((tokens, size_k), generator=g) * 2 - 1).to(torch.bfloat16)
    topk_ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)]).to(torch.int32)
    nibble = [9 + e % 4 for e in range(experts)]
    packed = [(v * 0x11111111) - (1 << 32) if v * 0x11111111 >= 1 << 31 else v * 0x11111111 for v in nibble]
    qweight = torch.tensor(packed, dtype=torch.int32).view(experts, 1, 1).expand(experts, size_k // 8, size_n)
    scale = 1 / 64
    scales = torch.full((experts, size_k // group, size_n), scale, dtype=torch.bfloat16)
    flat = topk_ids.flatten().tolist()
    numel = len(flat)
    padded_max = numel + experts * (block - 1)
    sorted_ids, expert_ids = [], []
    for e in range(experts):
        rows = [i for i, v in enumerate(flat) if v == e]
        if rows:
            rows += [numel] * (-len(rows) % block)
            sorted_ids += rows
            expert_ids += [e] * (len(rows) // block)
    post_padded = len(sorted_ids)
    sorted_ids += [numel] * (padded_max - post_padded)
    expert_ids += [0] * (-(-padded_max // block) - len(expert_ids))
    weight = torch.tensor([nibble[e] - 8 for e in flat], dtype=torch.float32)
    want = weight[:, None] * scale * x.float().sum(dim=1).repeat_interleave(top_k)[:, None].expand(numel, size_n)
    on = {"device": device}
    return {"x": x.to(**on), "qweight": qweight.contiguous().to(**on), "scales": scales.to(**on),
            "sorted_token_ids": torch.tensor(sorted_ids, dtype=torch.int32, **on),
            "expert_ids": torch.tensor(expert_ids, dtype=torch.int32, **on),
            "num_tokens_past_padded": torch.tensor([post_padded], dtype=torch.int32, **on),
            "topk_weights": torch.ones((tokens, top_k), dtype=torch.float32, **on), "want": want.to(**on),
            "experts": experts, "tokens": tokens, "top_k": top_k, "size_k": size_k, "size_n": size_n,
            "block": block}


def marlin_moe_gemm_args(c: dict, qweight, out, workspace, uint4b8) -> dict:
    """Every argument any supported release's moe_wna16_marlin_gemm takes, by name (0.16/0.18 also take g_idx, perm
    and is_k_full; 0.33 does not): ``by_signature`` keeps the installed release's."""
    return {"input": c["x"], "output": out, "b_qweight": qweight, "b_bias": None, "b_scales": c["scales"],
            "a_scales": None, "global_scale": None, "b_qzeros": None, "g_idx": None, "perm": None,
            "workspace": workspace, "sorted_token_ids": c["sorted_token_ids"], "expert_ids": c["expert_ids"],
            "num_tokens_past_padded": c["num_tokens_past_padded"], "topk_weights": c["topk_weights"],
            "moe_block_size": c["block"], "top_k": c["top_k"], "mul_topk_weights": False, "b_q_type": uint4b8,
            "size_m": c["tokens"], "size_n": c["size_n"], "size_k": c["size_k"], "is_k_full": True,
            "use_atomic_add": False, "use_fp32_reduce": True, "is_zp_float": False}


def _probe_vllm_marlin_moe(torch):
    """vLLM's _moe_C: moe_wna16_marlin_gemm, the INT4 expert GEMM of every Kimi-K2.5 MoE layer (the kernel that
    vllm#38619 saw fail on a driver that could not JIT its PTX), on weights repacked by the release's own
    gptq_marlin_repack, its answer checked."""
    from vllm import _custom_ops as ops
    from vllm.scalar_type import scalar_types
    c = marlin_moe_case(torch, "cuda")
    k, n = c["size_k"], c["size_n"]
    qweight = torch.stack([ops.gptq_marlin_repack(**_repack_args(ops, torch, c["qweight"][e].contiguous(), k, n))
                           for e in range(c["experts"])])
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    out = torch.empty((c["tokens"] * c["top_k"], n), dtype=torch.bfloat16, device="cuda")
    workspace = torch.zeros(sms * 16, dtype=torch.int32, device="cuda")
    args = by_signature(ops.moe_wna16_marlin_gemm, marlin_moe_gemm_args(c, qweight, out, workspace,
                                                                        scalar_types.uint4b8))
    got = ops.moe_wna16_marlin_gemm(**args)
    torch.cuda.synchronize()
    got = (out if got is None else got).float()
    err = (got - c["want"]).abs().max().item()
    tol = 0.02 * c["want"].abs().max().item() + 0.05
    if not err <= tol:          # NaN too
        raise AssertionError(f"Marlin MoE GEMM: largest error {err:.4g}, expected at most {tol:.4g}")
    return {"experts": c["experts"], "tokens": c["tokens"], "max_error": round(err, 5)}


def fa2_args(q, k, v, cu, max_seqlen: int, dim: int) -> dict:
    """flash_attn_varlen_func's arguments by name (the same in 0.16, 0.18, 0.22 and 0.33): a causal prefill, FA2."""
    return {"q": q, "k": k, "v": v, "max_seqlen_q": max_seqlen, "cu_seqlens_q": cu, "max_seqlen_k": max_seqlen,
            "cu_seqlens_k": cu, "softmax_scale": dim ** -0.5, "causal": True, "fa_version": 2}


def _probe_vllm_fa2(torch):
    """vLLM's FlashAttention 2 (vllm_flash_attn, _vllm_fa2_C): the attention of the EAGLE-3 drafter's Llama layer,
    carried only as PTX for sm_120 by every supported release (the driver JIT-compiles it at the drafter's first
    step).  A causal varlen prefill of two sequences, checked against torch's own attention."""
    from vllm.vllm_flash_attn import flash_attn_interface as fa
    if not fa.FA2_AVAILABLE:
        raise RuntimeError(f"vLLM's FlashAttention 2 does not load: {fa.FA2_UNAVAILABLE_REASON}")
    seqs, heads, dim = (5, 11), 4, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((sum(seqs), heads, dim), dtype=torch.bfloat16, device="cuda", generator=g)
               for _ in range(3))
    cu = torch.tensor([0, seqs[0], sum(seqs)], dtype=torch.int32, device="cuda")
    got = fa.flash_attn_varlen_func(**by_signature(fa.flash_attn_varlen_func, fa2_args(q, k, v, cu, max(seqs), dim)))
    got = got[0] if isinstance(got, tuple) else got
    torch.cuda.synchronize()
    want = torch.cat([torch.nn.functional.scaled_dot_product_attention(
        *(t[a:b].transpose(0, 1).float() for t in (q, k, v)), is_causal=True).transpose(0, 1)
        for a, b in ((0, seqs[0]), (seqs[0], sum(seqs)))])
    err = (got.float() - want).abs().max().item()
    if not err <= 0.03:          # NaN too
        raise AssertionError(f"FlashAttention 2: largest error {err:.4g} against torch's attention, expected at "
                             "most 0.03")
    return {"heads": heads, "head_dim": dim, "max_error": round(err, 5)}


def _probe_sglang_flashinfer_sampling(torch):
    """FlashInfer's top-k/top-p sampling kernel, called as SGLang's sampler calls it (flashinfer.sampling,
    ``filter_apply_order="joint"``): FlashInfer ships no prebuilt kernels, so this JIT-compiles it with the
    toolkit on the unit's PATH (nvcc, ninja, c++) into the service user's FlashInfer cache, which the server then
    finds warm; a server without that toolkit loads and dies at its first sampled request.  top_k = 1 on every
    row: the answer is each row's most likely token, whatever the random draw."""
    from flashinfer import sampling
    rows, vocab = 4, 163840
    probs = torch.rand((rows, vocab), device="cuda")
    want = torch.tensor([7, 81920, 163839, 12345], device="cuda")
    probs[torch.arange(rows, device="cuda"), want] = float(vocab)
    probs = probs / probs.sum(dim=1, keepdim=True)
    got = sampling.top_k_top_p_sampling_from_probs(
        probs, torch.ones((rows,), dtype=torch.int32, device="cuda"),
        torch.full((rows,), 0.9, dtype=torch.float32, device="cuda"), filter_apply_order="joint")
    torch.cuda.synchronize()
    if not torch.equal(got.to(torch.int64), want):
        raise AssertionError(f"FlashInfer top-k sampling: measured {got.tolist()}, expected {want.tolist()}")
    return {"vocab": vocab, "flashinfer": getattr(__import__("flashinfer"), "__version__", None)}


PROBES = {"vllm_marlin_repack": _probe_vllm_marlin_repack, "vllm_moe_topk": _probe_vllm_moe_topk,
          "vllm_marlin_moe": _probe_vllm_marlin_moe, "vllm_fa2": _probe_vllm_fa2,
          "sglang_flashinfer_sampling": _probe_sglang_flashinfer_sampling}
# probes run on rank 0 only (unless --triton-every-rank): a JIT compile, which every rank would otherwise queue
# for behind FlashInfer's build lock, into the one cache the server reads
RANK0_PROBES = frozenset({"sglang_flashinfer_sampling"})


def rank_main(a) -> int:
    rank = a.rank
    t = time.monotonic()
    try:
        import torch
        torch.cuda.set_device(rank)
        free, total = torch.cuda.mem_get_info()
        emit(rank, "cuda", name=torch.cuda.get_device_name(rank),
             compute_cap="%d.%d" % torch.cuda.get_device_capability(rank), free_mib=free // 2**20,
             total_mib=total // 2**20, torch=torch.__version__, cuda=torch.version.cuda,
             seconds=round(time.monotonic() - t, 3))
    except Exception as e:     # noqa: BLE001 - what CUDA says is the report
        emit(rank, "cuda", False, error=_error(e), seconds=round(time.monotonic() - t, 3))
        return 1
    if free // 2**20 < a.min_free_mib:
        emit(rank, "memory", False, free_mib=free // 2**20, needed_mib=a.min_free_mib)
        return 3
    emit(rank, "memory", free_mib=free // 2**20, needed_mib=a.min_free_mib)
    import datetime

    import torch.distributed as dist
    emit(rank, "nccl_init", nccl=".".join(map(str, torch.cuda.nccl.version())))
    t = time.monotonic()
    try:
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank, world_size=a.world,
                                timeout=datetime.timedelta(seconds=a.nccl_timeout_s),
                                device_id=torch.device("cuda", rank))
        n = a.allreduce_mib * 2**20 // 4
        x = torch.full((n,), float(rank + 1), device="cuda")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        want = a.world * (a.world + 1) / 2
        if x[0].item() != want or x[-1].item() != want:
            raise AssertionError(f"all-reduce sum: measured {x[0].item()} / {x[-1].item()}, expected {want}")
        joined = time.monotonic() - t
        t1 = time.monotonic()
        dist.all_reduce(x)
        torch.cuda.synchronize()
        step = time.monotonic() - t1
        busbw = 2 * (a.world - 1) / a.world * n * 4 / step / 1e9 if a.world > 1 else None
        emit(rank, "nccl", seconds=round(joined, 3), allreduce_mib=a.allreduce_mib,
             allreduce_seconds=round(step, 6), bus_gbps=round(busbw, 2) if busbw else None)
        del x
    except Exception as e:     # noqa: BLE001
        emit(rank, "nccl", False, error=_error(e), seconds=round(time.monotonic() - t, 3))
        return 1
    failed = False
    if rank == 0 or a.triton_every_rank:
        t = time.monotonic()
        try:
            got = _triton_add(torch)
            emit(rank, "triton", seconds=round(time.monotonic() - t, 3), **got)
        except Exception as e:     # noqa: BLE001
            emit(rank, "triton", False, error=_error(e), seconds=round(time.monotonic() - t, 3))
            failed = True
    for name in (p for p in a.probe if rank == 0 or a.triton_every_rank or p not in RANK0_PROBES):
        t = time.monotonic()
        try:
            got = PROBES[name](torch)
            emit(rank, "probe", probe=name, seconds=round(time.monotonic() - t, 3), **got)
        except (ImportError, AttributeError, TypeError) as e:   # this release has no such API: not its kernels' fault
            emit(rank, "probe", probe=name, skipped=_error(e), seconds=round(time.monotonic() - t, 3))
        except Exception as e:     # noqa: BLE001
            emit(rank, "probe", False, probe=name, error=_error(e), seconds=round(time.monotonic() - t, 3))
            failed = True
    try:
        dist.destroy_process_group()
    except Exception:     # noqa: BLE001 - the report is made
        pass
    emit(rank, "done", not failed)
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------- the ranks, watched (stdlib)
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(a) -> dict:
    port = free_port()
    program = a.rank_program or [sys.executable, "-I", os.path.abspath(__file__)]
    common = ["--world", str(a.world), "--port", str(port), "--min-free-mib", str(a.min_free_mib),
              "--allreduce-mib", str(a.allreduce_mib), "--nccl-timeout-s", str(a.nccl_timeout_s)]
    common += [w for p in a.probe for w in ("--probe", p)] + (["--triton-every-rank"] if a.triton_every_rank else [])
    sel = selectors.DefaultSelector()
    ranks, procs = [], []
    for r in range(a.world):
        # each rank leads its own process group: a hung rank's children go with it at the time limit
        p = subprocess.Popen(program + ["--rank", str(r)] + common, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        procs.append(p)
        ranks.append({"rank": r, "steps": {}, "probes": [], "stderr": b""})
        sel.register(p.stdout, selectors.EVENT_READ, (r, "out"))
        sel.register(p.stderr, selectors.EVENT_READ, (r, "err"))
    partial, pipes = {}, {r: 2 for r in range(a.world)}
    deadline = time.monotonic() + a.timeout_s
    stopped_by = None
    while any(pipes.values()) and stopped_by is None and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=max(0.0, min(1.0, deadline - time.monotonic()))):
            r, kind = key.data
            chunk = os.read(key.fileobj.fileno(), 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                pipes[r] -= 1
                # a rank that ended without its all-reduce: the others would wait for it until NCCL's own timeout
                if not pipes[r] and procs[r].wait() != 0 and not ranks[r]["steps"].get("nccl", {}).get("ok"):
                    stopped_by = r
                continue
            if kind == "err":
                ranks[r]["stderr"] = (ranks[r]["stderr"] + chunk)[-4000:]
                continue
            buf = partial.get(r, b"") + chunk
            *lines, partial[r] = buf.split(b"\n")
            # what a rank prints is bounded here (issue 53 N10): a report line is < 4 KB; a longer unfinished one is
            # cut to its last 64 KB (not JSON: skipped), and at most 64 probes a rank are kept
            partial[r] = partial[r][-65536:]
            for line in lines[-256:]:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if isinstance(ev, dict) and isinstance(ev.get("step"), str):
                    ev.pop("rank", None)
                    step = ev.pop("step")
                    if step != "probe" and (step in ranks[r]["steps"] or len(ranks[r]["steps"]) < 32):
                        ranks[r]["steps"][step] = ev
                    elif step == "probe" and len(ranks[r]["probes"]) < 64:
                        ranks[r]["probes"].append(ev)
    timed_out = any(pipes.values()) and stopped_by is None
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p, rk in zip(procs, ranks, strict=True):
        rk["exit"] = p.wait()
        rk["stderr"] = rk["stderr"].decode("utf-8", "replace")[-2000:]
    return {"world": a.world, "timed_out": timed_out, "timeout_s": a.timeout_s, "stopped_by": stopped_by,
            "ranks": ranks}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, required=True, help="ranks, one per GPU")
    ap.add_argument("--rank", type=int, help="run as this rank (the canary starts its ranks so)")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--timeout-s", type=float, default=180.0, help="the whole canary's limit")
    ap.add_argument("--nccl-timeout-s", type=float, default=120.0, help="NCCL's own limit for joining")
    ap.add_argument("--min-free-mib", type=int, default=2048, help="GPU memory a rank needs free")
    ap.add_argument("--allreduce-mib", type=int, default=64)
    ap.add_argument("--probe", action="append", default=[], choices=sorted(PROBES))
    ap.add_argument("--triton-every-rank", action="store_true")
    ap.add_argument("--rank-program", action="append", default=[],
                    help="argv of another program that runs a rank (repeat per word; the sandbox's stand-in)")
    a = ap.parse_args(argv)
    if a.rank is not None:
        return rank_main(a)
    t = time.monotonic()
    report = run_ranks(a)
    report["seconds"] = round(time.monotonic() - t, 3)
    print(PREFIX + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
