#!/usr/bin/env python3
"""SANDBOX ONLY: a vLLM stand-in server (the one simulated part of the deploy).

No GPU exists here, so this script takes the place of the engine's CUDA work.  What a
deployer can see is taken from the vLLM installed in this venv, not from memory
(docs/standin-fidelity.md has the table of every line and the vLLM file it comes from):
  * it takes the same argv as ``vllm serve`` (run as ``python vllm_standin.py serve ...``);
  * every log line's wording, source file and line number is read from the installed vLLM's
    source (``VllmSource`` in vllm_standin_log.py: AST, no import of vLLM), in vLLM's log format;
  * the shard progress bar is the real ``tqdm`` with vLLM's own ``_BAR_FORMAT`` (which ends
    in a newline in 0.16-0.18: every redraw is its own journal line), the CUDA-graph bars
    tqdm's default format (``\r`` redraws, one newline at the end), both behind vLLM's
    per-process ``(Worker_TP0 pid=N) `` prefix writer;
  * the order is vLLM's ``GPUModelRunner.load_model``: target weights, drafter, THEN the
    EAGLE-3 interface check (the real ``supports_eagle3`` of this venv's vLLM), then
    "Model loading took ..."; a failed check dies with vLLM's own RuntimeError text;
  * --enforce-eager: no torch.compile and no CUDA graphs (vLLM's config turns both off), one line that says so;
  * torch.compile: a cache miss ("Compiling a graph ...") on the first start with an empty
    cache directory, a hit ("Directly load the compiled graph(s) ...") after;
  * nothing listens until the load is done (connection refused, like vLLM), then it serves
    /health, /v1/models, /v1/chat/completions (standin_api.py) and /metrics with ``vllm:spec_decode_*``.
Rehearsal knobs (JSON, /etc/deployer-sandbox/standin.json): load_seconds, crash_phase,
stall_phase, phase_seconds {phase: s}, acceptance_rate, crash_after_ready_seconds,
unhealthy_after_ready_seconds (/health answers 503, the process lives on, as when the
engine core died), hang_after_ready_seconds (accepts connections, never answers), and
chat_status (the chat endpoint answers this HTTP status), empty_reply (empty completion text),
reasoning_only (the text in vLLM's `reasoning` field, content null: a thinking template's short answer),
reply_text (the completion's text), crash_text (appended to crash_phase's root-cause line: what a model prints),
no_drafts (the drafter never proposes), fatal_line_phase (log an NCCL error line in that phase and hang, the process
alive), and only_if_arg (a string: every failure knob applies only when some argv word equals it, so a new release
can fail while the previous one still starts).  Standard library, plus the venv's own tqdm (a vLLM dependency).
"""
import argparse
import hashlib
import importlib
import json
import os
import sys
import threading
import time
from http.server import ThreadingHTTPServer

try:    # on a sandbox host, or run as a script: the files beside this one
    import standin_api as api
    import standin_base as base
    from vllm_standin_log import PID, SRC, bar, die, log, stream
except ImportError:  # imported from the repository
    from deployer.sandbox import standin_api as api
    from deployer.sandbox import standin_base as base
    from deployer.sandbox.vllm_standin_log import PID, SRC, bar, die, log, stream

PHASES = ("weights", "drafter", "compile", "kv_cache", "graphs", "api")


def _supports_eagle3_cached():
    """The real ``supports_eagle3`` of this venv's vLLM, asked once per state of the files that decide it.

    Importing vLLM's model classes costs ~20 s of CPU per start; the answer depends only on this venv's source
    (the patch engine's targets), so it is remembered under a key of the venv and those files' contents (a patch
    or a revert rewrites them: a new key; the same files patched on another host: the same key, so the sandbox
    hands answers on between hosts: image.py).  SANDBOX bookkeeping, not vLLM behaviour."""
    files = []
    if SRC.root:
        models = os.path.join(SRC.root, "model_executor", "models")
        files = [os.path.join(models, n) for n in ("interfaces.py", "interfaces_base.py", "kimi_k25.py",
                                                   "deepseek_v2.py", "registry.py")]
    key = [sys.prefix]
    for f in files:
        try:
            with open(f, "rb") as fh:
                key.append("%s:%s" % (f, hashlib.sha256(fh.read()).hexdigest()))
        except OSError:
            key.append(f + ":-")
    path = os.path.join(base.STATE_DIR, "eagle3-%s.json" % hashlib.sha256("|".join(key).encode()).hexdigest()[:16])
    try:
        with open(path) as fh:
            got = json.load(fh)
        return got["ok"], got["version"], got["module"], True
    except (OSError, ValueError, KeyError):
        pass
    from vllm.model_executor.models.interfaces import supports_eagle3  # the real vLLM in this venv
    from vllm.model_executor.models.kimi_k25 import KimiK25ForConditionalGeneration
    got = {"ok": bool(supports_eagle3(KimiK25ForConditionalGeneration)), "version": __import__("vllm").__version__,
           "module": KimiK25ForConditionalGeneration.__module__}
    try:
        tmp = "%s.%d" % (path, PID)
        with open(tmp, "w") as fh:
            json.dump(got, fh)
        os.rename(tmp, path)
    except OSError:
        pass
    return got["ok"], got["version"], got["module"], False


def check_eagle3(drafter_dir, v2=False):
    """What vLLM's GPUModelRunner.load_model does for method=eagle3, after the drafter has loaded (Model Runner
    V2: set_eagle3_aux_hidden_state_layers, after the target's weights and before the drafter's, which then says
    which layers it captures)."""
    use_aux, top_ids = True, None
    try:
        with open(os.path.join(drafter_dir, "config.json")) as f:
            dc = json.load(f)
        ec = dc.get("eagle_config") or {}
        use_aux = ec.get("use_aux_hidden_state", True) is not False
        top_ids = dc.get("eagle_aux_hidden_state_layer_ids")
    except (OSError, ValueError, AttributeError):
        pass
    if not use_aux:
        return
    ok, version, module, cached = _supports_eagle3_cached()
    # SANDBOX marker line (real vLLM says nothing when the check passes): what was asked, and of which vLLM
    log(None, raw="supports_eagle3(KimiK25ForConditionalGeneration) = %s (vLLM %s, %s%s)"
        % (ok, version, module, "; remembered for these unchanged files" if cached else ""), where="vllm_standin.py")
    if not ok:
        die("RuntimeError", SRC.text("eagle3_v2" if v2 else "eagle3"))
    if v2:   # eagle3_utils.set_eagle3_aux_hidden_state_layers: the drafter's top-level ids, else the target's default
        if top_ids:
            log("eagle3_aux_cfg_v2", "(%s)" % ", ".join(str(i) for i in top_ids))
        else:
            log("eagle3_aux_v2", "(2, 30, 58)")   # Kimi-K2.5's 61 layers: (2, L // 2, L - 3)


# vLLM 0.16.0's vllm:time_to_first_token_seconds buckets (vllm/v1/metrics/loggers.py, histogram_time_to_first_token)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0, 160.0, 640.0, 2560.0)


class Metrics(object):
    def __init__(self, model_name, k, rate, spec):
        self.lock = threading.Lock()
        self.ttft = [0] * (len(TTFT_BUCKETS) + 1)     # per bucket (the last: +Inf), not cumulative
        self.ttft_sum = 0.0
        self.name, self.k, self.rate, self.spec = model_name, k, rate, spec
        self.drafts = self.draft_tokens = self.accepted = 0
        self.per_pos = [0] * k
        self.prompt = self.gen = 0

    def completion(self, prompt_tokens, gen_tokens, ttft_seconds=0.0):
        with self.lock:
            self.prompt += prompt_tokens
            self.gen += gen_tokens
            self.ttft[next((i for i, b in enumerate(TTFT_BUCKETS) if ttft_seconds <= b), len(TTFT_BUCKETS))] += 1
            self.ttft_sum += ttft_seconds
            if not self.spec or getattr(self, "no_drafts", False):
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
            out.append("# TYPE vllm:time_to_first_token_seconds histogram")
            seen = 0
            for i, b in enumerate(TTFT_BUCKETS + ("+Inf",)):
                seen += self.ttft[i]
                out.append('vllm:time_to_first_token_seconds_bucket{%s,le="%s"} %s' % (lab, b, float(seen)))
            out.append("vllm:time_to_first_token_seconds_count{%s} %s" % (lab, float(seen)))
            out.append("vllm:time_to_first_token_seconds_sum{%s} %s" % (lab, self.ttft_sum))
            if self.spec:
                counter("vllm:spec_decode_num_drafts", self.drafts)
                counter("vllm:spec_decode_num_draft_tokens", self.draft_tokens)
                counter("vllm:spec_decode_num_accepted_tokens", self.accepted)
                out.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter")
                for i, v in enumerate(self.per_pos):
                    out.append('vllm:spec_decode_num_accepted_tokens_per_pos_total{%s,position="%d"} %s'
                               % (lab, i, float(v)))
        return "\n".join(out) + "\n"


ENGINE = {"dead": False, "hung": False}   # set by the *_after_ready_seconds knobs


class VllmApi(api.ApiHandler):
    """vLLM's API server as a deployer sees it (standin_api.py has what both engines share)."""
    owned_by, reasoning_field = "vllm", "reasoning"
    reply_words, reply_id = "Sandbox stand-in reply", "chatcmpl-standin"
    card_extra = {"parent": None, "permission": []}
    # outside /v1, which vLLM's AuthenticationMiddleware alone checks: SageMaker's inference route and the
    # operational ones (vllm/entrypoints/sagemaker/api_router.py, serve/rlhf/api_router.py)
    open_posts = ("/invocations", "/pause", "/resume")

    def log_message(self, fmt, *a):
        out = stream("APIServer")
        out.write("INFO:     %s\n" % (fmt % a))
        out.flush()

    def gate(self):
        """A hung server accepts the connection and never answers; a dead engine core makes vLLM's
        /health answer 503 and requests fail with EngineDeadError while the API process lives on."""
        while ENGINE["hung"]:
            time.sleep(3600)
        if ENGINE["dead"]:
            if self.path == "/health":
                self._send(503)
            else:
                self._json(500, {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for "
                                                      "the root cause.", "type": "EngineDeadError", "code": 500}})
            return False
        return True

    def before_chat(self, req):
        if self.knobs.get("sampling_dies") and float(req.get("temperature") or 0) > 0:
            # the first non-greedy request compiles a sampling kernel at run time (Triton's, FlashInfer's);
            # on a host without a C compiler the engine core dies there, after the load passed (issue 42):
            # Triton's own words (triton/runtime/build.py), then the engine is dead for every later request
            err = stream("EngineCore_DP0")
            for line in ("Traceback (most recent call last):",
                         '  File "triton/runtime/build.py", line 33, in _build',
                         "RuntimeError: Failed to find C compiler. Please specify via CC environment variable "
                         "or set triton.knobs.build.impl."):
                err.write(f"ERROR {time.strftime('%m-%d %H:%M:%S')} [core.py:1512] {line}\n")
            err.flush()
            ENGINE.update(dead=True)
            return self.gate()
        return True


def parse_args(argv):
    """``vllm serve``'s flags that the stand-in acts on (the rest is passed on unread, as vLLM's checks ran)."""
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
    s.add_argument("--max-num-seqs", type=int)
    s.add_argument("--trust-remote-code", action="store_true")
    s.add_argument("--speculative-config", type=json.loads)
    s.add_argument("--enforce-eager", action="store_true")
    s.add_argument("--middleware", action="append", default=[])
    return p.parse_known_args(argv)


class Load(object):
    """The load, phase by phase, with the rehearsal knobs of this start applied at each phase's start."""

    def __init__(self, start, shards):
        self.k, self.ps, self.shards = start.knobs, start.seconds, shards
        self.bar_format = SRC.find("bar_format")[0]
        self.shards_desc = SRC.find("shards_desc")[0]

    def stall(self, name):
        if self.k.get("stall_phase") == name:
            base.Start.hang()    # silent after the phase's first line, like an NCCL deadlock

    def phase(self, name):
        if self.k.get("fatal_line_phase") == name:   # a fatal line while the process lives on (a wedged NCCL rank)
            log(None, raw="NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
                level="ERROR", where="pynccl.py")
            base.Start.hang()
        if name in ("weights", "drafter", "api"):
            self.stall(name)
        if self.k.get("crash_phase") == name:
            if name == "weights":  # real vLLM dies part-way through the shard bar
                bar(self.shards_desc, self.shards, min(self.ps[name], 1.0), self.bar_format, stop_at=self.shards // 4)
            time.sleep(min(self.ps[name], 1.0))
            exc_type, message = base.CRASHES[name]
            die(exc_type, message + str(self.k.get("crash_text") or ""))

    def model(self, args, spec):
        """V1's GPUModelRunner.load_model: target weights, drafter, THEN the EAGLE-3 interface check.  Model Runner
        V2 (the only runner from 0.34; vllm/v1/worker/gpu/model_runner.py): target weights, the EAGLE-3 check and its
        aux layers line, then the drafter, which says nothing of its own before its shard bar."""
        v2 = not SRC.has("start") and SRC.has("start_v2")
        log("start_v2" if v2 else "start", *(() if v2 else (args.model_tag,)))
        self.phase("weights")
        t0 = time.time()
        bar(self.shards_desc, self.shards, self.ps["weights"], self.bar_format)
        log("weights_took", time.time() - t0, who="Worker_TP0")
        if v2 and spec.get("method") == "eagle3":
            check_eagle3(spec.get("model", ""), v2=True)
        if spec:
            if not v2:
                log("drafter")
            self.phase("drafter")
            t1 = time.time()
            bar(self.shards_desc, 1, self.ps["drafter"], self.bar_format)   # the drafter's single safetensors file
            log("weights_took", time.time() - t1)
        if not v2 and spec.get("method") == "eagle3":
            check_eagle3(spec.get("model", ""))
        log("model_took_v2" if v2 else "model_took", "74.31", time.time() - t0)
        return v2, t0

    def compile(self, argv, port):
        """torch.compile's cache: a miss on the first start of a config, a hit after (vllm/compilation/backends.py)."""
        ps = self.ps
        self.phase("compile")
        cache_root = os.environ.get("VLLM_CACHE_ROOT") or os.path.join(os.path.expanduser("~"), ".cache", "vllm")
        key = hashlib.sha256(json.dumps(sorted(a for a in argv if a != str(port))).encode()).hexdigest()[:10]
        cache_dir = os.path.join(cache_root, "torch_compile_cache", key, "rank_0_0", "backbone")
        hit = os.path.exists(os.path.join(cache_dir, "standin-compiled"))
        log("cache_dir", cache_dir)
        self.stall("compile")
        time.sleep(ps["compile"] / 2)
        log("dynamo", ps["compile"] / 2)
        if hit:
            log("compile_hit", "(1, 8192)", ps["compile"] / 4)
        else:
            time.sleep(ps["compile"] / 2)
            log("compile_miss", "(1, 8192)", ps["compile"] / 2)
            try:
                os.makedirs(cache_dir, exist_ok=True)
                open(os.path.join(cache_dir, "standin-compiled"), "w").close()
            except OSError:
                pass
        log("compile_total", ps["compile"])

    def kv_cache(self):
        self.phase("kv_cache")
        time.sleep(self.ps["kv_cache"])
        log("kv_mem", "11.42")
        self.stall("kv_cache")
        if "KV cache size" in SRC.find("max_conc")[0]:
            # 0.33+: one line for both, "GPU KV cache size: N tokens, Maximum concurrency for ..."
            # (kv_cache_utils.update_kv_cache_capacity)
            log("max_conc", "GPU", "418,016", "131,072", 3.19, who="EngineCore_DP0")
        else:
            log("kv_size", "418,016", who="EngineCore_DP0")
            log("max_conc", "131,072", 3.19, who="EngineCore_DP0")

    def graphs(self, v2):
        self.phase("graphs")
        if v2:   # CudaGraphManager.capture: desc=f"{progress_bar_desc} ({mode.name})", one bar per mode
            graphs = SRC.find("graphs_desc_v2")[0]
            descs = ("%s (PIECEWISE)" % graphs, "%s (FULL)" % graphs)
        else:
            graphs = SRC.find("graphs_desc")[0]
            descs = (graphs.format("mixed prefill-decode", "PIECEWISE"), graphs.format("decode", "FULL"))
        if self.k.get("stall_phase") == "graphs":
            bar(descs[0], 33, 0.2, stop_at=5)
            self.stall("graphs")
        bar(descs[0], 33, self.ps["graphs"] / 2)
        bar(descs[1], 19, self.ps["graphs"] / 2)
        log("graphs_done_v2" if v2 else "graphs_done", max(1, int(self.ps["graphs"])), 2.39)


def serve(args, k, spec):
    """The API once the load is done (nothing listens before), and the after-ready knobs."""
    host = args.host or "0.0.0.0"
    log("api", 0, "http://%s:%d" % (host, args.port), who="APIServer")
    k_tokens = int(spec.get("num_speculative_tokens", 3)) if spec else 0
    metrics = Metrics(args.served_model_name or args.model_tag, max(1, k_tokens),
                      float(k.get("acceptance_rate", 0.6)), bool(spec))
    metrics.no_drafts = bool(k.get("no_drafts"))
    started = time.time()
    name = args.served_model_name or args.model_tag
    # build_app: each --middleware imported by name once the engine is up (a missing one fails after the load),
    # a class added with app.add_middleware
    middleware = []
    for mw in args.middleware:
        module_path, object_name = mw.rsplit(".", 1)
        middleware.append(getattr(importlib.import_module(module_path), object_name))
    handler = VllmApi.make(knobs=k, metrics=metrics, api_key=os.environ.get("VLLM_API_KEY", ""), model_name=name,
                           model_root=args.model_tag, max_model_len=args.max_model_len or 262144, started=started,
                           middleware=tuple(middleware))
    srv = ThreadingHTTPServer((host, args.port), handler)
    log(None, raw="Available routes are:", who="APIServer", where="launcher.py")
    uvicorn = stream("APIServer")
    uvicorn.write("INFO:     Application startup complete.\n")   # uvicorn's own line
    uvicorn.flush()
    base.mark("ready_at")
    if k.get("crash_after_ready_seconds") is not None:
        def die_while_serving():
            # a worker dies while serving (an Xid, a segfault): vLLM's two monitor lines, then the exit
            log("worker_died", "VllmWorker-3", -9, who="EngineCore_DP0", level="ERROR")   # 0.33+: and its exit code
            if SRC.has("core_died"):
                log("core_died", "EngineCore_DP0", who="APIServer", level="ERROR")
            # then the API server shuts itself down and exits 0, as the real one does (uvicorn's own lines; recorded
            # on vLLM 0.20.0 with an H200, tests/fixtures/real-gpu/vllm-0.20.0-h200/bad_drafter; the exit status 0
            # measured on vLLM 0.32.0 on a CPU: docs/real-engine.md): only a unit that restarts on a clean exit too
            # (Restart=always) brings such a server back
            for line in ("Shutting down", "Waiting for application shutdown.", "Application shutdown complete."):
                uvicorn.write(f"INFO:     {line}\n")
            uvicorn.flush()
            os._exit(0)
        threading.Timer(float(k["crash_after_ready_seconds"]), die_while_serving).start()
    if k.get("unhealthy_after_ready_seconds") is not None:
        threading.Timer(float(k["unhealthy_after_ready_seconds"]), lambda: ENGINE.update(dead=True)).start()
    if k.get("hang_after_ready_seconds") is not None:
        threading.Timer(float(k["hang_after_ready_seconds"]), lambda: ENGINE.update(hung=True)).start()
    srv.serve_forever()


def main(argv):
    if "--model-path" in argv:   # `sglang serve --model-path ...`: the stand-in plays SGLang
        try:
            import sglang_standin  # beside this file (a sandbox host, or run as a script)
        except ImportError:
            from deployer.sandbox import sglang_standin
        return sglang_standin.main(argv)
    args, unknown = parse_args(argv)
    start = base.Start(argv, PHASES)
    log(None, raw="vLLM API server version (sandbox stand-in)", who="APIServer", where="vllm_standin.py")
    log(None, raw="non-default args: %s" % json.dumps({"model_tag": args.model_tag, "unknown": unknown,
                                                      "speculative_config": args.speculative_config}),
        who="APIServer", where="vllm_standin.py")
    if args.enforce_eager:   # config/vllm.py: compilation mode NONE, cudagraph mode NONE; the worker captures nothing
        log("eager", who="APIServer")
    load = Load(start, base.model_shards(args.model_tag))
    spec = args.speculative_config or {}
    v2, t0 = load.model(args, spec)
    if not args.enforce_eager:
        load.compile(argv, args.port)
    load.kv_cache()
    if not args.enforce_eager:
        load.graphs(v2)
    log("engine", time.time() - t0, 0.0 if args.enforce_eager else load.ps["compile"],   # 0.20+: and the compile s
        who="EngineCore_DP0")
    load.phase("api")
    time.sleep(load.ps["api"])
    serve(args, start.knobs, spec)


if __name__ == "__main__":
    main(sys.argv[1:])
