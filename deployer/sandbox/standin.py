#!/usr/bin/env python3
"""SANDBOX ONLY: a vLLM stand-in server (the one simulated part of the deploy).

No GPU exists here, so this script takes the place of the engine's CUDA work.
Everything a deployer can see is kept faithful to vLLM (formats from
shared/reference/kimi-eagle3-serving.md §5-6):
  * it takes the same argv as ``vllm serve`` (run as ``python standin.py serve ...``);
  * during load it prints vLLM's log lines (tqdm bars with ``\\r``), load time compressed;
  * nothing listens until the load is done (connection refused, like vLLM);
  * with an EAGLE-3 speculative config it asks the *real* vLLM installed in this venv
    whether ``KimiK25ForConditionalGeneration`` supports EAGLE-3 (``supports_eagle3``),
    at the point real vLLM does (after the target weights load), and dies with vLLM's
    own RuntimeError if not;
  * then serves /health, /v1/models, /v1/chat/completions and /metrics with
    ``vllm:spec_decode_*`` counters that grow with traffic.
Rehearsal knobs (JSON, /etc/deployer-sandbox/standin.json): load_seconds, crash_phase,
stall_phase, phase_seconds {phase: s}, acceptance_rate, crash_after_ready_seconds, and
only_if_arg (a string: crash/stall only when some argv word equals it, so a new release can
fail while the previous one still starts).
Standard library only (it runs with the host venv's python).
"""
import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KNOBS_FILE = os.environ.get("DEPLOYER_STANDIN_KNOBS", "/etc/deployer-sandbox/standin.json")
STATE_DIR = os.environ.get("DEPLOYER_STANDIN_STATE", "/run/deployer-standin")
PHASES = ("weights", "drafter", "compile", "kv_cache", "graphs", "api")
PID = os.getpid()


def knobs():
    k = {"load_seconds": 4.0, "crash_phase": None, "stall_phase": None, "phase_seconds": {},
         "acceptance_rate": 0.6, "crash_after_ready_seconds": None}
    try:
        with open(KNOBS_FILE) as f:
            k.update(json.load(f))
    except (OSError, ValueError):
        pass
    return k


def log(msg, who="EngineCore_DP0", level="INFO", where="core.py:100"):
    ts = time.strftime("%m-%d %H:%M:%S")
    sys.stdout.write("(%s pid=%d) %s %s [%s] %s\n" % (who, PID, level, ts, where, msg))
    sys.stdout.flush()


def bar(desc, total, seconds, stream=sys.stderr, stop_at=None):
    """A tqdm-style bar: redraws separated by \\r, final newline (vLLM's bar_format)."""
    start = time.time()
    for n in range(total + 1 if stop_at is None else stop_at + 1):
        el = time.time() - start
        stream.write("\r(Worker_TP0 pid=%d) %s: %3.0f%% Completed | %d/%d [%02d:%02d<00:00, %.2fit/s]"
                     % (PID, desc, 100.0 * n / total, n, total, el // 60, el % 60, (n / el) if el else 0.0))
        stream.flush()
        if n < total:
            time.sleep(seconds / total)
    stream.write("\n")
    stream.flush()


def mark(name):
    """Rehearsal bookkeeping for the benchmarks: when did the stand-in die / become ready."""
    try:
        with open(os.path.join(STATE_DIR, name), "w") as f:
            f.write("%.6f\n" % time.time())
    except OSError:
        pass


def die(exc_type, message, where="vllm/v1/worker/gpu_model_runner.py", func="load_model"):
    log("EngineCore failed to start.", level="ERROR", where="core.py:866")
    sys.stdout.write("(EngineCore_DP0 pid=%d) Traceback (most recent call last):\n" % PID)
    sys.stdout.write('(EngineCore_DP0 pid=%d)   File "%s", line 1, in %s\n' % (PID, where, func))
    sys.stdout.write("(EngineCore_DP0 pid=%d) %s: %s\n" % (PID, exc_type, message))
    sys.stdout.write("RuntimeError: Engine core initialization failed. See root cause above. "
                     "Failed core proc(s): {}\n")
    sys.stdout.flush()
    mark("died_at")
    sys.exit(1)


CRASHES = {
    "weights": ("torch.OutOfMemoryError", "CUDA out of memory. Tried to allocate 1.75 GiB. GPU 0 has a total "
                "capacity of 95.59 GiB of which 1.02 GiB is free."),
    "drafter": ("torch.OutOfMemoryError", "CUDA out of memory. Tried to allocate 896.00 MiB."),
    "compile": ("torch._dynamo.exc.BackendCompilerFailed", "backend='inductor' raised: RuntimeError"),
    "kv_cache": ("ValueError", "No available memory for the cache blocks. Try increasing "
                 "`gpu_memory_utilization` when initializing the engine."),
    "graphs": ("RuntimeError", "NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"),
    "api": ("RuntimeError", "NCCL error: remote process exited or there was a network error"),
}


def check_eagle3(drafter_dir):
    """What vLLM's GPUModelRunner.load_model does for method=eagle3 (0.14-0.21 text)."""
    use_aux = True
    try:
        with open(os.path.join(drafter_dir, "config.json")) as f:
            ec = json.load(f).get("eagle_config") or {}
        use_aux = ec.get("use_aux_hidden_state", True) is not False
    except (OSError, ValueError):
        pass
    if not use_aux:
        return
    from vllm.model_executor.models.interfaces import supports_eagle3  # the real vLLM in this venv
    from vllm.model_executor.models.kimi_k25 import KimiK25ForConditionalGeneration
    ok = supports_eagle3(KimiK25ForConditionalGeneration)
    log("supports_eagle3(KimiK25ForConditionalGeneration) = %s (vLLM %s, %s)"
        % (ok, __import__("vllm").__version__, KimiK25ForConditionalGeneration.__module__),
        who="Worker_TP0", where="gpu_model_runner.py:3500")
    if not ok:
        die("RuntimeError", "Model does not support EAGLE3 interface but aux_hidden_state_outputs was requested")


class Metrics(object):
    def __init__(self, model_name, k, rate, spec):
        self.lock = threading.Lock()
        self.name, self.k, self.rate, self.spec = model_name, k, rate, spec
        self.drafts = self.draft_tokens = self.accepted = 0
        self.per_pos = [0] * k
        self.prompt = self.gen = 0

    def completion(self, prompt_tokens, gen_tokens):
        with self.lock:
            self.prompt += prompt_tokens
            self.gen += gen_tokens
            if not self.spec:
                return
            for _ in range(max(1, gen_tokens // 2)):
                # deterministic: the running total of accepted tokens tracks rate * draft tokens,
                # and acceptance is a prefix (position i only if 0..i-1 were accepted), as in vLLM
                self.drafts += 1
                self.draft_tokens += self.k
                take = min(self.k, max(0, int(round(self.rate * self.draft_tokens)) - self.accepted))
                self.accepted += take
                for i in range(take):
                    self.per_pos[i] += 1

    def text(self):
        lab = 'engine="0",model_name="%s"' % self.name
        out = []
        with self.lock:
            def counter(name, value, extra=""):
                out.append("# TYPE %s counter" % name)
                out.append("%s_total{%s%s} %s" % (name, lab, extra, float(value)))
            counter("vllm:prompt_tokens", self.prompt)
            counter("vllm:generation_tokens", self.gen)
            out.append("# TYPE vllm:kv_cache_usage_perc gauge")
            out.append("vllm:kv_cache_usage_perc{%s} 0.0" % lab)
            out.append("# TYPE vllm:num_requests_running gauge")
            out.append("vllm:num_requests_running{%s} 0.0" % lab)
            if self.spec:
                counter("vllm:spec_decode_num_drafts", self.drafts)
                counter("vllm:spec_decode_num_draft_tokens", self.draft_tokens)
                counter("vllm:spec_decode_num_accepted_tokens", self.accepted)
                out.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter")
                for i, v in enumerate(self.per_pos):
                    out.append('vllm:spec_decode_num_accepted_tokens_per_pos_total{%s,position="%d"} %s'
                               % (lab, i, float(v)))
        return "\n".join(out) + "\n"


def make_handler(args, metrics, api_key, started):
    class H(BaseHTTPRequestHandler):
        server_version = "uvicorn"
        sys_version = ""

        def log_message(self, fmt, *a):
            sys.stdout.write('(APIServer pid=%d) INFO:     %s - "%s"\n' % (PID, self.client_address[0], fmt % a))
            sys.stdout.flush()

        def _send(self, code, body=b"", ctype="application/json"):
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _authorized(self):
            if not api_key:
                return True
            if self.headers.get("Authorization", "") == "Bearer " + api_key:
                return True
            self._send(401, json.dumps({"error": "Unauthorized"}).encode())
            return False

        def do_GET(self):
            if self.path == "/health":
                return self._send(200)
            if self.path == "/metrics":
                return self._send(200, metrics.text().encode(), "text/plain; version=0.0.4; charset=utf-8")
            if self.path == "/v1/models":
                if not self._authorized():
                    return
                card = {"id": args.served_model_name or args.model_tag, "object": "model", "created": int(started),
                        "owned_by": "vllm", "root": args.model_tag, "parent": None,
                        "max_model_len": args.max_model_len or 262144, "permission": []}
                return self._send(200, json.dumps({"object": "list", "data": [card]}).encode())
            self._send(404, json.dumps({"detail": "Not Found"}).encode())

        def do_POST(self):
            if self.path != "/v1/chat/completions":
                return self._send(404, json.dumps({"detail": "Not Found"}).encode())
            if not self._authorized():
                return
            n = int(self.headers.get("content-length") or 0)
            try:
                req = json.loads(self.rfile.read(n) or b"{}")
            except ValueError:
                return self._send(400, json.dumps({"error": {"message": "invalid JSON"}}).encode())
            want = req.get("model")
            name = args.served_model_name or args.model_tag
            if want and want != name:
                return self._send(404, json.dumps({"error": {"message": "The model `%s` does not exist." % want,
                                                             "type": "NotFoundError", "code": 404}}).encode())
            prompt = " ".join(str(m.get("content", "")) for m in req.get("messages", []))
            max_tokens = int(req.get("max_tokens") or 16)
            text = "Sandbox stand-in reply (%s): %s" % ("EAGLE-3 on" if metrics.spec else "no speculation",
                                                         prompt[:40])
            gen = min(max_tokens, max(1, len(text.split())))
            metrics.completion(max(1, len(prompt.split())), gen)
            body = {"id": "chatcmpl-standin-%d" % int(time.time() * 1000), "object": "chat.completion",
                    "created": int(time.time()), "model": name,
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": gen,
                              "total_tokens": len(prompt.split()) + gen}}
            self._send(200, json.dumps(body).encode())
    return H


def main(argv):
    p = argparse.ArgumentParser(prog="vllm")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("model_tag")
    s.add_argument("--served-model-name")
    s.add_argument("--host", default="0.0.0.0")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--tensor-parallel-size", type=int, default=1)
    s.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    s.add_argument("--max-model-len", type=int)
    s.add_argument("--trust-remote-code", action="store_true")
    s.add_argument("--speculative-config", type=json.loads)
    args, unknown = p.parse_known_args(argv)
    k = knobs()
    if k.get("only_if_arg") is not None and k["only_if_arg"] not in argv:
        k["crash_phase"] = k["stall_phase"] = None
    os.makedirs(STATE_DIR, exist_ok=True)
    with open(os.path.join(STATE_DIR, "argv.json"), "w") as f:
        json.dump({"argv": argv, "pid": PID, "started": time.time()}, f)
    log("vLLM API server version (sandbox stand-in)", who="APIServer", where="utils.py:253")
    log("non-default args: %s" % json.dumps({"model_tag": args.model_tag, "unknown": unknown,
                                              "speculative_config": args.speculative_config}),
        who="APIServer", where="utils.py:254")
    ps = dict((ph, float(k["load_seconds"]) / len(PHASES)) for ph in PHASES)
    ps.update(k.get("phase_seconds") or {})

    def stall(name):
        if k.get("stall_phase") == name:
            while True:  # hang silently after the phase's first line, like an NCCL deadlock
                time.sleep(3600)

    def phase(name):
        if k.get("stall_phase") == name and name in ("weights", "drafter", "api"):
            stall(name)
        if k.get("crash_phase") == name:
            if name == "weights":  # real vLLM dies part-way through the shard bar
                bar("Loading safetensors checkpoint shards", shards, min(ps[name], 1.0) / 4, stop_at=shards // 4)
            time.sleep(min(ps[name], 1.0))
            exc, msg = CRASHES[name]
            die(exc, msg)

    cfg_path = os.path.join(args.model_tag, "config.json")
    if not os.path.exists(cfg_path):
        sys.stdout.write("OSError: %s does not appear to have a file named config.json.\n" % args.model_tag)
        sys.exit(1)
    shards = 64
    try:
        with open(os.path.join(args.model_tag, "model.safetensors.index.json")) as f:
            shards = len(set(json.load(f)["weight_map"].values()))
    except (OSError, ValueError, KeyError):
        pass
    spec = args.speculative_config or {}
    k_tokens = int(spec.get("num_speculative_tokens", 3)) if spec else 0

    log("Starting to load model %s..." % args.model_tag, who="Worker_TP0", where="gpu_model_runner.py:3300")
    phase("weights")
    t0 = time.time()
    bar("Loading safetensors checkpoint shards", shards, ps["weights"])
    log("Loading weights took %.2f seconds" % (time.time() - t0), who="Worker_TP0", where="default_loader.py:320")
    if spec.get("method") == "eagle3":
        check_eagle3(spec.get("model", ""))
    if spec:
        log("Loading drafter model...", who="Worker_TP0", where="eagle.py:1200")
        phase("drafter")
        t1 = time.time()
        time.sleep(ps["drafter"])
        log("Loading weights took %.2f seconds" % (time.time() - t1), who="Worker_TP0", where="default_loader.py:320")
    log("Model loading took 74.31 GiB memory and %.6f seconds" % (time.time() - t0), who="Worker_TP0",
        where="gpu_model_runner.py:3400")
    phase("compile")
    log("Using cache directory: /root/.cache/vllm/torch_compile_cache/0f1e2d3c/rank_0_0/backbone for vLLM's "
        "torch.compile", where="backends.py:610")
    stall("compile")
    time.sleep(ps["compile"] / 2)
    log("Dynamo bytecode transform time: %.2f s" % (ps["compile"] / 2), where="monitor.py:34")
    time.sleep(ps["compile"] / 2)
    log("torch.compile took %.2f s in total" % ps["compile"], where="monitor.py:45")
    phase("kv_cache")
    time.sleep(ps["kv_cache"])
    log("Available KV cache memory: 11.42 GiB", who="Worker_TP0", where="gpu_worker.py:300")
    stall("kv_cache")
    log("GPU KV cache size: 418,016 tokens", where="kv_cache_utils.py:1100")
    log("Maximum concurrency for 131,072 tokens per request: 3.19x", where="kv_cache_utils.py:1104")
    phase("graphs")
    if k.get("stall_phase") == "graphs":
        bar("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)", 33, 0.2, stop_at=5)
        sys.stderr.write("\n")  # so the partial bar reaches the journal before the hang
        stall("graphs")
    bar("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)", 33, ps["graphs"] / 2)
    bar("Capturing CUDA graphs (decode, FULL)", 19, ps["graphs"] / 2)
    log("Graph capturing finished in %d secs, took 2.39 GiB" % max(1, int(ps["graphs"])), who="Worker_TP0",
        where="gpu_model_runner.py:4100")
    log("init engine (profile, create kv cache, warmup model) took %.2f s (compilation: %.2f s)"
        % (time.time() - t0, ps["compile"]), where="core.py:250")
    phase("api")
    time.sleep(ps["api"])
    host = args.host or "0.0.0.0"
    log("Starting vLLM API server 0 on http://%s:%d" % (host, args.port), who="APIServer", where="api_server.py:1900")
    metrics = Metrics(args.served_model_name or args.model_tag, max(1, k_tokens),
                      float(k.get("acceptance_rate", 0.6)), bool(spec))
    started = time.time()
    srv = ThreadingHTTPServer((host, args.port),
                              make_handler(args, metrics, os.environ.get("VLLM_API_KEY", ""), started))
    log("Available routes are:", who="APIServer", where="launcher.py:46")
    sys.stdout.write("(APIServer pid=%d) INFO:     Application startup complete.\n" % PID)
    sys.stdout.flush()
    mark("ready_at")
    if k.get("crash_after_ready_seconds") is not None:
        threading.Timer(float(k["crash_after_ready_seconds"]), lambda: os._exit(1)).start()
    srv.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
