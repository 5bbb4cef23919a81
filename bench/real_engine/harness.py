#!/usr/bin/env python3
"""The real-engine bench: run the real vLLM server as the deployer launches it, and record what a deployer sees.

Each run uses the argv ``deployer.serve.build_serve_argv`` builds and runs the engine under the unit's own
log-line wrapper (``roles/render/files/journal_lines.py``, as the systemd unit does), so what is recorded is what
journald would receive: every byte the wrapper wrote with the time it arrived, the ``/health`` transitions
(polled every 0.25 s), and the API's answers (``/v1/models``, ``/metrics`` before and after one and five chat
completions, the chat's body).  ``bench/real_engine/replay.py`` feeds a recording through the deployer's watcher;
the checked-in recordings are test fixtures (``tests/fixtures/real-gpu/``) and ``docs/real-engine.md`` has the table.

Needs a GPU machine with vLLM importable (its Python is ``sys.executable``).  On an H200 machine (torch 2.11, CUDA 13):
``bench/real_engine/run_on_device.sh`` (installs the carried wheels, makes the models, runs the scenarios).

    python bench/real_engine/harness.py --models /root/m --out /root/runs cold warm mt_prefetch sigkill gpu_busy
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from deployer.engines.vllm_argv import build_serve_argv  # noqa: E402

PORT = 8000
WRAPPER = REPO / "roles" / "render" / "files" / "journal_lines.py"


def launcher() -> list[str]:
    return (json.loads(os.environ.get("HARNESS_LAUNCHER") or "null")
            or [sys.executable, "-m", "vllm.entrypoints.cli.main"])


def argv_for(model: str, drafter: str | None = None, gmu: float = 0.6, mml: int = 4096, extra=(), **load) -> list[str]:
    """The deployer's own argv (tensor parallel 1 on one GPU), under the unit's log-line wrapper."""
    spec = {"launcher": launcher(), "model": model, "served_model_name": "kimi-k2.5", "host": "127.0.0.1",
            "port": PORT, "tensor_parallel_size": 1, "gpu_memory_utilization": gmu, "max_model_len": mml,
            "trust_remote_code": True, "extra_args": list(extra),
            "speculative": {"method": "eagle3", "model": drafter, "num_speculative_tokens": 3} if drafter else {},
            **load}
    return [sys.executable, "-I", "-S", str(WRAPPER), "--"] + build_serve_argv(spec)


def http(method: str, path: str, body=None, timeout: float = 120) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return {"status": r.status, "body": r.read().decode("utf-8", "replace"),
                    "seconds": round(time.time() - t0, 3)}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "body": e.read().decode("utf-8", "replace"), "seconds": round(time.time() - t0, 3)}
    except Exception as e:  # noqa: BLE001 - a refused or reset connection is a measurement too
        return {"status": 0, "error": f"{type(e).__name__}: {e}", "seconds": round(time.time() - t0, 3)}


def api_checks() -> dict:
    out = {"models": http("GET", "/v1/models"), "metrics_before": http("GET", "/metrics")}
    chat = {"model": "kimi-k2.5", "messages": [{"role": "user", "content": "Reply with one short sentence."}],
            "max_tokens": 32, "temperature": 0}
    out["chat"] = http("POST", "/v1/chat/completions", chat)
    out["metrics_after_one"] = http("GET", "/metrics")
    for _ in range(4):
        http("POST", "/v1/chat/completions", dict(chat, max_tokens=64))
    out["metrics_after_five"] = http("GET", "/metrics")
    out["health_after"] = http("GET", "/health")
    return out


def children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc)."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def run(out_dir: Path, name: str, argv: list[str], budget: float = 300, after_ready=None, during=None,
        env_extra=None, exit_wait_seconds: float = 0) -> dict:
    """One server run, recorded.  ``exit_wait_seconds``: after ``after_ready``, how long the server may take to
    end by itself (its exit status is what a unit's Restart= sees) before it is stopped."""
    d = out_dir / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "argv.json").write_text(json.dumps(argv))
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env_extra or {}))
    t0 = time.time()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    log, idx = open(d / "output.bin", "wb"), open(d / "timing.jsonl", "w")
    events: list[dict] = []

    def reader():
        off = 0
        while True:
            b = os.read(p.stdout.fileno(), 65536)
            if not b:
                break
            log.write(b)
            log.flush()
            idx.write(json.dumps({"t": round(time.time() - t0, 3), "off": off, "n": len(b)}) + "\n")
            idx.flush()
            off += len(b)
    th = threading.Thread(target=reader, daemon=True)
    th.start()
    if during:
        threading.Thread(target=during, args=(p, t0, d, events), daemon=True).start()
    health, last, ready_at, result = [], None, None, {"name": name}
    while time.time() - t0 < budget:
        if p.poll() is not None:
            break
        r = http("GET", "/health", timeout=2)
        if r["status"] != last:
            health.append({"t": round(time.time() - t0, 3), "status": r["status"], "error": r.get("error", "")[:120]})
            last = r["status"]
        if r["status"] == 200:
            ready_at = time.time() - t0
            break
        time.sleep(0.25)
    result["ready_seconds"] = round(ready_at, 3) if ready_at else None
    CURRENT["p"] = p
    if ready_at and after_ready:
        result["api"] = after_ready()
    if exit_wait_seconds:
        try:
            p.wait(timeout=exit_wait_seconds)
            result["exited_by_itself_after"] = round(time.time() - t0, 3)
        except subprocess.TimeoutExpired:
            pass
    result["exit_before_stop"] = p.poll()
    if p.poll() is None:
        ts = time.time()
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        result["stop_seconds"] = round(time.time() - ts, 3)
    result["returncode"] = p.returncode
    result["total_seconds"] = round(time.time() - t0, 3)
    th.join(timeout=5)
    result["health"] = health
    result["events"] = events
    (d / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("name", "ready_seconds", "returncode", "total_seconds")}), flush=True)
    time.sleep(3)
    return result


CURRENT: dict = {}     # the server process of the run in progress (for after_ready callbacks)


def engine_core(p) -> int:
    core = [c for c in children(p.pid) if "EngineCore" in cmdline(c) or "VLLM::EngineCore" in cmdline(c)]
    return core[0] if core else max(children(p.pid) or [p.pid])


def chat_then_kill_engine() -> dict:
    """``after_ready``: one chat completion, then SIGKILL the engine-core process while the API server serves (the
    OOM killer's way); the run then waits for the API server to end by itself and records its exit status."""
    out = {"chat": http("POST", "/v1/chat/completions", {"model": "kimi-k2.5", "max_tokens": 8, "temperature": 0,
                                                          "messages": [{"role": "user", "content": "hello"}]})}
    target = engine_core(CURRENT["p"])
    out["sigkill"] = {"pid": target, "cmdline": cmdline(target)[:200], "t": time.time()}
    os.kill(target, signal.SIGKILL)
    return out


def sigkill_engine_at(phase_line: str):
    """``during``: once the output shows ``phase_line``, SIGKILL the engine-core process (what the kernel's OOM
    killer does to the largest process: no message, no traceback)."""
    def during(p, t0, d, events):
        deadline = time.time() + 240
        while time.time() < deadline and p.poll() is None:
            data = (d / "output.bin").read_bytes() if (d / "output.bin").exists() else b""
            if phase_line.encode() in data:
                target = engine_core(p)
                os.kill(target, signal.SIGKILL)
                events.append({"t": round(time.time() - t0, 3), "sigkill": target, "cmdline": cmdline(target)[:200]})
                return
            time.sleep(0.2)
    return during


def hold_gpu_memory(gib: float) -> subprocess.Popen:
    """Another process holding GPU memory at start (a stray job, a second server)."""
    code = ("import torch,time,sys; x=torch.empty(int(%f*2**30),dtype=torch.uint8,device='cuda'); "
            "print('held',flush=True); time.sleep(3600)" % gib)
    h = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    h.stdout.readline()
    return h


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True, help="made by bench/real_engine/make_models.py")
    ap.add_argument("--out", required=True)
    ap.add_argument("scenarios", nargs="+")
    a = ap.parse_args()
    m, out = Path(a.models), Path(a.out)
    good = argv_for(str(m / "target"), str(m / "drafter"))
    for s in a.scenarios:
        if s == "cold":
            run(out, "good_cold", good, budget=420, after_ready=api_checks)
        elif s == "warm":
            run(out, "good_warm", good, budget=300, after_ready=api_checks)
        elif s == "mt_prefetch":   # vLLM 0.20's own prefetch and the multi-thread loader: progress of the weights
            run(out, "mt_prefetch", argv_for(str(m / "target_big"), str(m / "drafter"),
                                             safetensors_load_strategy="prefetch",
                                             model_loader_extra_config={"enable_multithread_load": True,
                                                                        "num_threads": 8}),
                budget=420, after_ready=api_checks)
        elif s == "sigkill":
            run(out, "sigkill_in_compile", good, budget=240, during=sigkill_engine_at("torch.compile"))
        elif s == "gpu_busy":
            h = hold_gpu_memory(100)
            try:
                run(out, "gpu_busy", good, budget=240)
            finally:
                h.kill()
        elif s == "nested":   # the drafter's aux ids only inside eagle_config (AQ-MedAI/Kimi-K25-eagle3's shape)
            d = m / "drafter_nested"
            if not d.exists():
                import shutil
                shutil.copytree(m / "drafter", d)
                cfg = json.loads((d / "config.json").read_text())
                cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": cfg.pop("eagle_aux_hidden_state_layer_ids")}
                (d / "config.json").write_text(json.dumps(cfg, indent=1))
            run(out, "nested_drafter", argv_for(str(m / "target"), str(d)), budget=300, after_ready=api_checks)
        elif s == "death_while_serving":   # issue 41: the exit status of an API server whose engine died
            # vLLM >= 0.30 refuses a full-vocabulary drafter that ships d2t (make_models' has one): drafter_fullvocab
            # is the same drafter without d2t/t2d when it exists
            d = m / "drafter_fullvocab" if (m / "drafter_fullvocab").exists() else m / "drafter"
            run(out, "death_while_serving", argv_for(str(m / "target"), str(d)), budget=900,
                after_ready=chat_then_kill_engine, exit_wait_seconds=120)
        elif s == "kimi_wrapper":
            run(out, "kimi_wrapper", argv_for(str(m / "kimi"), str(m / "drafter")), budget=300, after_ready=api_checks)
        else:
            print(f"unknown scenario {s}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
