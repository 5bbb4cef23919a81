#!/usr/bin/env python3
"""SANDBOX ONLY: the stand-in playing SGLang (``sglang serve --model-path ...``); vllm_standin.py hands over to it.

What a deployer can see of SGLang, taken from the SGLang installed in this venv where it can be
(docs/backends.md lists each line and its file):
  * log lines in SGLang's format (``[YYYY-MM-DD HH:MM:SS TP3] message``: a ``TPn`` per rank when --tp-size > 1,
    no file:line), each message located in the installed source by ``ast`` (standin_base.EngineSource with this module's
    MESSAGES: the constant parts of SGLang's f-strings), in the order of SGLang 0.5.23's own start-up
    (``managers/scheduler.py``, ``init_model_worker``): target weights ("Load weight begin/end" on every rank, the
    shard bar with SGLang's ``BAR_FORMAT``: ``\\r`` redraws only), the drafter's weights (every rank again), the KV
    pools (the target's, then the drafter's: two "KV Cache is allocated" lines per rank), the attention backends,
    where the EAGLE-3 hook is checked (``configure_aux_hidden_state_capture``: SGLang's own ValueError when
    KimiK25ForConditionalGeneration lacks ``set_eagle3_layers_to_capture``, read from the installed source), CUDA
    graphs (the target's on every rank, its end line with ``bs=[...]``; the drafter's decode and extend graphs on
    rank 0 only: ``log_info_on_rank0``), uvicorn, warm-up, "The server is fired up and ready to roll!";
  * nothing listens until the graphs are done; then /health answers 503 while the server starts and, once it is
    up, runs a one-token generation: it answers after at least 1 s (``health_generate_seconds``), 503 past
    SGLang's 20 s HEALTH_CHECK_TIMEOUT;
  * the API key from the ``--config`` YAML (SGLang merges it with argv), /health, /metrics exempt from it;
  * /metrics with SGLang's names and labels: the counters every finished request adds to
    (``sglang:generation_tokens_total``, ``num_requests_total``, ``spec_verify_calls_total``) and the gauges
    ``sglang:spec_accept_length`` / ``spec_accept_rate``, set - like the ``Decode batch ... accept len`` log line -
    only every ``decode_log_interval`` (40) decode steps (``scheduler_components/metrics_reporter.py``): a short
    request on a fresh server leaves them at 0.
Rehearsal knobs: those of vllm_standin.py that apply (crash_phase weights|kv_cache|graphs, stall_phase,
acceptance_rate, no_drafts, chat_status, empty_reply, reasoning_only, only_if_arg, load_seconds, phase_seconds), and
health_generate_seconds (how long /health's generation takes once up).
"""
import argparse
import ast
import json
import os
import sys
import threading
import time
from http.server import ThreadingHTTPServer

try:    # on a sandbox host, or run as a script: the files beside this one
    import standin_api as api
    import standin_base as base
except ImportError:  # imported from the repository
    from deployer.sandbox import standin_api as api
    from deployer.sandbox import standin_base as base

PID = os.getpid()
PHASES = ("weights", "kv_cache", "graphs", "drafter", "api")
# key -> (file under sglang/, anchors): the constant parts of the f-string SGLang logs
MESSAGES = {
    "weights_begin": ("srt/model_executor/model_runner.py", ("Load weight begin. avail mem=",)),
    "weights_end": ("srt/model_executor/model_runner.py", ("Load weight end. ",)),
    "eagle3": ("srt/model_executor/model_runner_components/attention_backend_setup.py",
               ("set_eagle3_layers_to_capture, which EAGLE3 aux hidden-state ",)),
    "kv": ("srt/mem_cache/memory_pool.py", ("#tokens: ",)),
    "pool_end": ("srt/mem_cache/kv_cache_configurator.py", ("Memory pool end. ",)),
    "graph_begin": ("srt/model_executor/model_runner_components/cuda_graph_setup.py", (" CUDA graph begin. ",)),
    "graph_end_bs": ("srt/model_executor/model_runner_components/cuda_graph_setup.py", ("bs=",)),
    "draft_graphs": ("srt/speculative/eagle_worker_v2.py", ("Capture draft decode CUDA graph begin. backend=",)),
    "health_generate": ("srt/entrypoints/http_server.py", ("Health check failed. Server couldn't get a response",)),
    "ready": ("srt/entrypoints/http_server.py", ("The server is fired up and ready to roll!",)),
    "sigquit": ("srt/entrypoints/engine.py", ("Received sigquit from a child process",)),
    "decode": ("srt/managers/scheduler_components/metrics_reporter.py", ("accept len: ",)),
    "bar_format": ("srt/utils/common.py", ("% Completed |",)),
    "shards_desc": ("srt/model_loader/weight_utils.py", ("Loading safetensors checkpoint shards",)),
}
FALLBACK = {k: v[1][0] for k, v in MESSAGES.items()}
FALLBACK["eagle3"] = (" does not implement set_eagle3_layers_to_capture, which EAGLE3 aux hidden-state capture "
                      "requires.")
FALLBACK["bar_format"] = ("{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} "
                          "[{elapsed}<{remaining}, {rate_fmt}]")
SRC = base.EngineSource("sglang", MESSAGES, FALLBACK)
ENGINE = {"warm": False, "tp_size": 1}
DECODE_LOG_INTERVAL = 40        # srt/arg_groups/fields/observability.py: decode_log_interval's default
HEALTH_CHECK_TIMEOUT = 20       # srt/entrypoints/http_server.py (SGLANG_HEALTH_CHECK_TIMEOUT)


def log(msg, tp=True, out=None, rank=0):
    """SGLang's ``configure_logger`` format: ``[%(asctime)s TP3] %(message)s`` in a scheduler process (the TP part
    only with --tp-size > 1), ``[%(asctime)s] %(message)s`` in the launcher."""
    out = out or sys.stdout
    prefix = " TP%d" % rank if tp and ENGINE["tp_size"] > 1 else ""
    out.write("[%s%s] %s\n" % (time.strftime("%Y-%m-%d %H:%M:%S"), prefix, msg))
    out.flush()


def log_ranks(msg):
    """A line every scheduler logs (``logger.info``): once per tensor-parallel rank."""
    for r in range(ENGINE["tp_size"]):
        log(msg, rank=r)


def hook_present(class_name="KimiK25ForConditionalGeneration", method="set_eagle3_layers_to_capture"):
    """Does the installed SGLang's Kimi-K2.5 class define the EAGLE-3 hook (as SGLang's hasattr would find)?"""
    if not SRC.root:
        return True
    try:
        with open(os.path.join(SRC.root, "srt", "models", "kimi_k25.py")) as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError):
        return False
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return any(isinstance(n, ast.FunctionDef) and n.name == method for n in node.body)
    return False


def die(exc_type, message):
    """A scheduler process dies: its traceback ending in the root cause, then the launcher's own line."""
    err = sys.stdout
    err.write("[%s%s] Scheduler hit an exception: Traceback (most recent call last):\n"
              % (time.strftime("%Y-%m-%d %H:%M:%S"), " TP0" if ENGINE["tp_size"] > 1 else ""))
    err.write('  File "sglang/srt/managers/scheduler.py", line 1, in run_scheduler_process\n')
    err.write("%s: %s\n" % (exc_type, message))
    log(SRC.find("sigquit")[0], tp=False)
    err.flush()
    base.mark("died_at")
    sys.exit(1)


# the engine-independent root causes are the vLLM stand-in's; SGLang's own words where they differ
CRASHES = dict(base.CRASHES, kv_cache=("RuntimeError", "Not enough memory. Please try to increase "
                                                       "--mem-fraction-static."))


def bar(desc, total, seconds, stop_at=None):
    """SGLang's shard bar: the venv's tqdm with SGLang's BAR_FORMAT (no newline: ``\\r`` redraws)."""
    fmt = SRC.find("bar_format")[0]
    steps = total if stop_at is None else stop_at
    try:
        from tqdm import tqdm
    except ImportError:
        for n in range(steps + 1):
            sys.stderr.write("\r%s: %3.0f%% Completed | %d/%d" % (desc, 100.0 * n / total, n, total))
            time.sleep(seconds / max(1, total))
        sys.stderr.write("\n" if stop_at is None else "")
        sys.stderr.flush()
        return
    t = tqdm(total=total, desc=desc, file=sys.stderr, mininterval=0, bar_format=fmt)
    for _ in range(steps):
        time.sleep(seconds / max(1, total))
        t.update(1)
    if stop_at is None:
        t.close()
    sys.stderr.flush()


class Metrics(object):
    """SGLang's /metrics as a deployer reads it.  Counters: every finished request adds its tokens, itself and its
    verify steps (observe_one_finished_request).  Gauges: the decode window's acceptance, set only when the
    decode-step count crosses a multiple of DECODE_LOG_INTERVAL (metrics_reporter.py), with the log line."""

    def __init__(self, name, drafts_per_step, rate, spec):
        self.lock = threading.Lock()
        self.name, self.k, self.rate, self.spec = name, drafts_per_step, rate, spec
        self.verify_calls = self.prompt = self.gen = self.requests = 0
        self.decode_steps = self.win_steps = self.win_tokens = self.win_correct = 0
        self.accept_length = self.accept_rate = 0.0
        self.no_drafts = False

    def completion(self, prompt_tokens, gen_tokens, ttft_seconds=None):
        """One finished request (its time to first token is not kept: this stand-in has no TTFT histogram); returns
        the decode log line when this request crossed a logging interval."""
        with self.lock:
            self.prompt += prompt_tokens
            self.gen += gen_tokens
            self.requests += 1
            if not self.spec or self.no_drafts or gen_tokens < 2:
                return None
            # the first token is the prefill's; each verify step then yields its accepted drafts + 1 token
            steps = max(1, int(round((gen_tokens - 1) / (1.0 + self.rate * self.k))))
            correct = max(0, min(steps * self.k, gen_tokens - 1 - steps))
            self.verify_calls += steps
            self.win_steps += steps
            self.win_tokens += steps + correct
            self.win_correct += correct
            before, self.decode_steps = self.decode_steps, self.decode_steps + steps
            if self.decode_steps // DECODE_LOG_INTERVAL == before // DECODE_LOG_INTERVAL:
                return None
            self.accept_length = float(self.win_tokens) / self.win_steps
            self.accept_rate = float(self.win_correct) / (self.win_steps * self.k) if self.k else 0.0
            self.win_steps = self.win_tokens = self.win_correct = 0
            return (self.accept_length, self.accept_rate)

    def text(self):
        lab = 'model_name="%s",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"' % self.name
        req = 'model_name="%s",is_streaming="false"' % self.name
        out = []
        with self.lock:
            for name, kind, value, labels in (
                    ("sglang:prompt_tokens_total", "counter", self.prompt, req),
                    ("sglang:generation_tokens_total", "counter", self.gen, req),
                    ("sglang:num_requests_total", "counter", self.requests, req),
                    ("sglang:num_running_reqs", "gauge", 0, lab),
                    ("sglang:spec_accept_length", "gauge", self.accept_length, lab),
                    ("sglang:spec_accept_rate", "gauge", self.accept_rate, lab),
                    ("sglang:spec_verify_calls_total", "counter", self.verify_calls, 'model_name="%s"' % self.name)):
                out.append("# TYPE %s %s" % (name.replace("_total", "") if kind == "counter" else name, kind))
                out.append("%s{%s} %s" % (name, labels, float(value)))
        return "\n".join(out) + "\n"


def api_key_of(config_path):
    """SGLang merges the --config YAML into its argv; the stand-in needs only the key."""
    if not config_path:
        return ""
    try:
        import yaml
        with open(config_path) as f:
            data = yaml.safe_load(f) or {}
    except ImportError:
        data = {}
        with open(config_path) as f:
            for line in f:
                if line.startswith("api-key:"):
                    data["api-key"] = json.loads(line.split(":", 1)[1].strip())
    return str(data.get("api-key") or data.get("api_key") or "")


class SglangApi(api.ApiHandler):
    """SGLang's HTTP server as a deployer sees it (standin_api.py has what both engines share)."""
    owned_by, reasoning_field = "sglang", "reasoning_content"
    reply_words, reply_id = "Sandbox SGLang stand-in reply", "standin"
    health_paths = ("/health", "/health_generate")

    def log_message(self, fmt, *args):
        sys.stdout.write("[%s] INFO:     %s\n" % (time.strftime("%Y-%m-%d %H:%M:%S"), fmt % args))
        sys.stdout.flush()

    def health(self):
        if not ENGINE["warm"]:                            # ServerStatus.Starting: 503 at once
            return self._send(503)
        # up: a one-token generation; SGLang polls for its answer once a second, for at most 20 s
        took = float(self.knobs.get("health_generate_seconds", 1.0))
        time.sleep(min(max(1.0, took), HEALTH_CHECK_TIMEOUT))
        if took > HEALTH_CHECK_TIMEOUT:
            log("Health check failed. Server couldn't get a response from detokenizer for last %d seconds."
                % HEALTH_CHECK_TIMEOUT, tp=False)
            return self._send(503)
        return self._send(200)

    def error_body(self, code, message, kind):
        return {"object": "error", "message": message, "type": kind, "code": code}

    def completed(self, prompt_tokens, gen_tokens, ttft_seconds):
        window = self.metrics.completion(prompt_tokens, gen_tokens, ttft_seconds)
        if window:   # the scheduler's decode log line, every decode_log_interval steps (metrics_reporter.py)
            log("Decode batch, #running-req: 1, #token: %d, token usage: 0.00, %s%.2f, accept rate: %.2f, "
                "cuda graph: True, gen throughput (token/s): 42.00, #queue-req: 0"
                % (gen_tokens, SRC.find("decode")[0], window[0], window[1]))


def main(argv):
    p = argparse.ArgumentParser(prog="sglang serve")
    p.add_argument("cmd")
    for flag in ("--model-path", "--served-model-name", "--host", "--speculative-algorithm", "--config",
                 "--speculative-draft-model-path", "--attention-backend"):
        p.add_argument(flag)
    for flag in ("--port", "--tp-size", "--context-length", "--speculative-num-steps",
                 "--speculative-num-draft-tokens"):
        p.add_argument(flag, type=int)
    a, _unknown = p.parse_known_args(argv)
    start = base.Start(argv, PHASES, engine="sglang")
    k, ps = start.knobs, start.seconds
    log("SANDBOX: SGLang stand-in (SGLang %s's messages) serving %s" % (_version(), a.model_path), tp=False)
    spec = (a.speculative_algorithm or "").upper() == "EAGLE3"
    shards = base.model_shards(a.model_path)

    def phase(name):
        if k.get("stall_phase") == name:
            base.Start.hang()
        if k.get("crash_phase") == name:
            time.sleep(min(ps[name], 1.0))
            die(*CRASHES[name])

    ENGINE["tp_size"] = max(1, a.tp_size or 1)
    desc = SRC.find("shards_desc")[0]
    # managers/scheduler.py, init_model_worker: the target's weights, the drafter's, the KV pools, the attention
    # backends, the CUDA graphs
    t0 = time.time()
    log_ranks("Load weight begin. avail mem=93.12 GB")
    phase("weights")
    bar(desc, shards, ps["weights"])
    log_ranks("Load weight end. elapsed=%.2f s, type=KimiK25ForConditionalGeneration, avail mem=20.51 GB, "
              "mem usage=72.61 GB." % (time.time() - t0))
    if spec:
        t1 = time.time()
        log_ranks("Load weight begin. avail mem=20.51 GB")
        phase("drafter")
        bar(desc, 1, ps["drafter"] / 2)
        drafter_class = "LlamaForCausalLMEagle3"
        try:
            with open(os.path.join(a.speculative_draft_model_path or "", "config.json")) as f:
                drafter_class = (json.load(f).get("architectures") or [drafter_class])[0]
        except (OSError, ValueError):
            pass
        log_ranks("Load weight end. elapsed=%.2f s, type=%s, avail mem=19.31 GB, mem usage=1.20 GB."
                  % (time.time() - t1, drafter_class))
    phase("kv_cache")
    time.sleep(ps["kv_cache"])
    # the target's pool (Kimi-K2.5: MLA, one latent cache) and the drafter's (Llama: MHA, K and V), same #tokens
    log_ranks("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 418016, KV size: 11.42 GB")
    if spec:
        log_ranks("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 418016, K size: 0.20 GB, V size: 0.20 GB")
    log_ranks("Memory pool end. avail mem=8.10 GB")
    if spec and not hook_present():   # init_attention_backends -> configure_aux_hidden_state_capture
        # the f-string's constant part after the class name: " does not implement set_eagle3_layers_to_capture, ..."
        die("ValueError", "Model KimiK25ForConditionalGeneration" + SRC.find("eagle3")[0])
    phase("graphs")
    role = "target verify" if spec else "target decode"
    log_ranks("Capture %s CUDA graph begin. backend=full, num_tokens_per_req=%d, avail mem=8.10 GB"
              % (role, (a.speculative_num_draft_tokens or 4) if spec else 1))
    time.sleep(ps["graphs"])
    log_ranks("Capture %s CUDA graph end. bs=[1, 2, 4, 8], elapsed=%.2f s, mem usage=1.20 GB, avail mem=6.90 GB."
              % (role, ps["graphs"]))
    if spec:   # speculative/eagle_worker_v2.py: log_info_on_rank0
        for role in ("draft decode", "draft extend"):
            log("Capture %s CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 2, 4, 8], "
                "avail mem=6.90 GB" % role)
            time.sleep(ps["drafter"] / 4)
            log("Capture %s CUDA graph end. elapsed=%.2f s, mem usage=0.40 GB, avail mem=6.50 GB."
                % (role, ps["drafter"] / 4))
    phase("api")
    host, port = a.host or "127.0.0.1", a.port or 30000
    steps = a.speculative_num_steps or 3
    metrics = Metrics(a.served_model_name or a.model_path, (a.speculative_num_draft_tokens or steps + 1) - 1,
                      float(k.get("acceptance_rate", 0.6)), spec)
    metrics.no_drafts = bool(k.get("no_drafts"))
    handler = SglangApi.make(knobs=k, metrics=metrics, api_key=api_key_of(a.config),
                             model_name=a.served_model_name or a.model_path, model_root=a.model_path,
                             max_model_len=a.context_length or 262144)
    srv = ThreadingHTTPServer((host, port), handler)
    for line in ("Started server process [%d]" % PID, "Waiting for application startup.",
                 "Application startup complete.",
                 "Uvicorn running on http://%s:%d (Press CTRL+C to quit)" % (host, port)):
        sys.stdout.write("INFO:     %s\n" % line)
    sys.stdout.flush()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    time.sleep(ps["api"])          # the warm-up request
    ENGINE["warm"] = True
    log(SRC.find("ready")[0], tp=False)
    base.mark("ready_at")
    while True:
        time.sleep(3600)


def _version():
    try:
        import importlib.metadata as md
        return md.version("sglang")
    except Exception:
        return "?"


if __name__ == "__main__":
    main(sys.argv[1:])
