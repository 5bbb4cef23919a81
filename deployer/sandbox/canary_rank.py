#!/usr/bin/python3
"""SANDBOX ONLY: one rank of the GPU canary (roles/canary/files/gpu_canary.py) on the simulated GPUs.

The canary itself (the orchestrator: ranks, time limit, report) is the real one; this plays what only a GPU can do,
in the real rank's lines (tests/fixtures/real-gpu/canary: a real rank on an H100; tests/unit/test_canary.py holds the
two to the same keys).  Its NCCL group is a real rendezvous on the canary's port (rank 0 listens, every other rank
connects and sends its value, rank 0 answers the sum): a rank that never comes leaves rank 0 waiting as NCCL would,
until the canary's limit or ``--nccl-timeout-s`` (then the message torch's TCPStore gives).

Rehearsal knobs, in /etc/deployer-sandbox/gpus.json beside nvidia-smi's (``used_mib``, ``memory_mib``, ``name``):
  "cuda_error": {"3": "CUDA error: ..."}   CUDA init on GPU 3 fails with this message
  "canary_hang": {"5": "cuda"}              GPU 5's rank hangs in CUDA init (it never joins)
  "nccl_hang": true                         every rank joins and the all-reduce never finishes (a P2P hang)
  "probe_error": {"vllm_marlin_repack": "CUDA error: ..."}   a release kernel fails
"""
import argparse
import json
import socket
import sys
import time

CONF = "/etc/deployer-sandbox/gpus.json"
DEFAULT = {"name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "memory_mib": 97887, "used_mib": 0}
# what CUDA and torch say (the real rank's lines: tests/fixtures/real-gpu/canary)
CUDA_ERROR = "torch.AcceleratorError: CUDA error: %s"
STORE_TIMEOUT = ("torch.distributed.DistStoreError: Timed out after %d seconds waiting for clients. "
                 "%d/%d clients joined.")


def emit(rank, step, ok=True, **kw):
    print(json.dumps({"rank": rank, "step": step, "ok": ok, **kw}), flush=True)


def conf():
    c = dict(DEFAULT)
    try:
        with open(CONF) as f:
            c.update(json.load(f))
    except (OSError, ValueError):
        pass
    return c


def used(c, i):
    u = c.get("used_mib", 0)
    return int(u[i] if isinstance(u, list) and i < len(u) else (0 if isinstance(u, list) else u))


def rendezvous(a, hang):
    """A sum over the ranks through rank 0 (the TCPStore's place); None on rank 0's timeout."""
    want = a.world * (a.world + 1) / 2
    if a.rank == 0:
        srv = socket.create_server(("127.0.0.1", a.port))
        srv.settimeout(1.0)
        conns, total, t = [], 1.0, time.monotonic()
        while len(conns) < a.world - 1:
            if time.monotonic() - t > a.nccl_timeout_s:
                return STORE_TIMEOUT % (round(time.monotonic() - t), len(conns) + 1, a.world)
            try:
                c, _ = srv.accept()
            except socket.timeout:
                continue
            total += float(c.makefile().readline())
            conns.append(c)
        if hang:
            time.sleep(10**6)
        for c in conns:
            c.sendall(b"%f\n" % total)
        return total if total == want else f"all-reduce sum: measured {total}, expected {want}"
    t = time.monotonic()
    while True:
        try:
            c = socket.create_connection(("127.0.0.1", a.port), timeout=1.0)
            break
        except OSError:
            if time.monotonic() - t > a.nccl_timeout_s:
                return STORE_TIMEOUT % (round(time.monotonic() - t), 0, a.world)
            time.sleep(0.1)
    c.sendall(b"%f\n" % (a.rank + 1))
    c.settimeout(None)
    return float(c.makefile().readline())


def main():
    ap = argparse.ArgumentParser()
    for flag in ("--world", "--rank", "--port", "--min-free-mib", "--allreduce-mib"):
        ap.add_argument(flag, type=int, required=flag in ("--world", "--rank"), default=0)
    ap.add_argument("--nccl-timeout-s", type=float, default=120.0)
    ap.add_argument("--probe", action="append", default=[])
    ap.add_argument("--triton-every-rank", action="store_true")
    a = ap.parse_args()
    c, r = conf(), a.rank
    t = time.monotonic()
    if (c.get("canary_hang") or {}).get(str(r)) == "cuda":
        time.sleep(10**6)
    err = (c.get("cuda_error") or {}).get(str(r))
    if err:
        emit(r, "cuda", False, error=CUDA_ERROR % err, seconds=1.8)
        return 1
    free = int(c["memory_mib"]) - used(c, r)
    emit(r, "cuda", name=c["name"], compute_cap="12.0", free_mib=free, total_mib=int(c["memory_mib"]),
         torch="2.9.0+cu129", cuda="12.9", seconds=round(time.monotonic() - t + 1.8, 3))
    if free < a.min_free_mib:
        emit(r, "memory", False, free_mib=free, needed_mib=a.min_free_mib)
        return 3
    emit(r, "memory", free_mib=free, needed_mib=a.min_free_mib)
    emit(r, "nccl_init", nccl="2.27.3")
    t = time.monotonic()
    got = rendezvous(a, bool(c.get("nccl_hang")))
    if isinstance(got, str):
        emit(r, "nccl", False, error=got, seconds=round(time.monotonic() - t, 3))
        return 1
    busbw = 2 * (a.world - 1) / a.world * a.allreduce_mib * 2**20 / 0.0123 / 1e9
    emit(r, "nccl", seconds=round(time.monotonic() - t, 3), allreduce_mib=a.allreduce_mib,
         allreduce_seconds=0.0123, bus_gbps=round(busbw, 2) if a.world > 1 else None)
    if r == 0 or a.triton_every_rank:
        emit(r, "triton", seconds=0.9, triton="3.5.0")
    failed = False
    for p in a.probe:
        perr = (c.get("probe_error") or {}).get(p)
        if perr:
            emit(r, "probe", False, probe=p, error=CUDA_ERROR % perr, seconds=0.2)
            failed = True
        else:
            emit(r, "probe", probe=p, seconds=0.2)
    emit(r, "done", not failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
