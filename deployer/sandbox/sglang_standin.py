#!/usr/bin/env python3
"""SANDBOX ONLY: the stand-in playing SGLang (``sglang serve --model-path ...``); standin.py hands over to it.

What a deployer can see of SGLang, taken from the SGLang installed in this venv where it can be
(docs/backends.md lists each line and its file):
  * log lines in SGLang's format (``[YYYY-MM-DD HH:MM:SS TP0] message``, no file:line), each message located
    in the installed source by ``ast`` (standin.VllmSource with this module's MESSAGES: the constant parts of
    SGLang's f-strings), in SGLang's order: target weights ("Load weight begin/end", the shard bar with SGLang's
    ``BAR_FORMAT``: ``\\r`` redraws only, so journald sees the bar once, at its end), the EAGLE-3 hook check
    (``configure_aux_hidden_state_capture``: SGLang's own ValueError when KimiK25ForConditionalGeneration lacks
    ``set_eagle3_layers_to_capture``, read from the installed source), KV cache, target CUDA graphs, the drafter's
    weights and graphs, uvicorn, warm-up, "The server is fired up and ready to roll!";
  * nothing listens until the weights, KV cache and graphs are done; then /health answers 503 until the
    warm-up is over, like SGLang's (a 1-token generation when ready);
  * the API key from the ``--config`` YAML (SGLang merges it with argv), /health, /metrics exempt from it;
  * /metrics with SGLang's names and labels: ``sglang:spec_accept_length``, ``sglang:spec_accept_rate``
    (gauges), ``sglang:spec_verify_calls_total``, token counters; the decode log line with ``accept len``.
Rehearsal knobs: those of standin.py that apply (crash_phase weights|kv_cache|graphs, stall_phase,
acceptance_rate, no_drafts, chat_status, empty_reply, only_if_arg, load_seconds, phase_seconds).
"""
import argparse
import ast
import json
import os
import sys
import threading
import time
from http.server import ThreadingHTTPServer

try:
    import vllm_standin as base  # on a sandbox host (copied beside this file)
except ImportError:                      # in the repository
    from deployer.sandbox import standin as base

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
    "ready": ("srt/entrypoints/http_server.py", ("The server is fired up and ready to roll!",)),
    "sigquit": ("srt/entrypoints/engine.py", ("Received sigquit from a child process",)),
    "decode": ("srt/managers/scheduler_components/metrics_reporter.py", ("accept len: ",)),
    "bar_format": ("srt/utils/common.py", ("% Completed |",)),
    "shards_desc": ("srt/model_loader/weight_utils.py", ("Loading safetensors checkpoint shards",)),
}
FALLBACK = {k: v[1][0] for k, v in MESSAGES.items()}
FALLBACK["eagle3"] = (" does not implement set_eagle3_layers_to_capture, which EAGLE3 aux hidden-state capture "
                      "requires.")
FALLBACK["bar_format"] = "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]"
SRC = base.VllmSource("sglang", MESSAGES, FALLBACK)
ENGINE = {"warm": False}


def log(msg, tp=True, out=None):
    """SGLang's ``configure_logger`` format: ``[%(asctime)s TP0] %(message)s`` in scheduler processes."""
    out = out or sys.stdout
    out.write("[%s%s] %s\n" % (time.strftime("%Y-%m-%d %H:%M:%S"), " TP0" if tp else "", msg))
    out.flush()


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
    err.write("[%s TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
              % time.strftime("%Y-%m-%d %H:%M:%S"))
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
    def __init__(self, name, steps, rate, spec):
        self.lock = threading.Lock()
        self.name, self.steps, self.rate, self.spec = name, steps, rate, spec
        self.verify_calls = self.prompt = self.gen = 0
        self.accept_length = self.accept_rate = 0.0
        self.no_drafts = False

    def completion(self, prompt_tokens, gen_tokens):
        with self.lock:
            self.prompt += prompt_tokens
            self.gen += gen_tokens
            if not self.spec or self.no_drafts:
                return
            # each verify step checks `steps` drafts and keeps rate * steps of them, plus the bonus token
            self.verify_calls += max(1, int(gen_tokens / (1 + self.rate * self.steps)))
            self.accept_rate = self.rate
            self.accept_length = 1 + self.rate * self.steps

    def text(self):
        lab = 'model_name="%s",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"' % self.name
        out = []
        with self.lock:
            for name, kind, value, labels in (
                    ("sglang:prompt_tokens_total", "counter", self.prompt, 'model_name="%s"' % self.name),
                    ("sglang:generation_tokens_total", "counter", self.gen, 'model_name="%s"' % self.name),
                    ("sglang:num_running_reqs", "gauge", 0, lab),
                    ("sglang:spec_accept_length", "gauge", self.accept_length, lab),
                    ("sglang:spec_accept_rate", "gauge", self.accept_rate, lab),
                    ("sglang:spec_num_steps", "gauge", self.steps if self.spec else 0, lab),
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


def make_handler(a, metrics, api_key, k):
    class H(base.ApiHandler):
        def log_message(self, fmt, *args):
            sys.stdout.write("[%s] INFO:     %s\n" % (time.strftime("%Y-%m-%d %H:%M:%S"), fmt % args))
            sys.stdout.flush()


        def do_GET(self):
            if self.path in ("/health", "/health_generate"):   # exempt from the API key; 503 until warm
                return self._send(200 if ENGINE["warm"] else 503)
            if self.path == "/metrics":
                return self._send(200, metrics.text().encode(), "text/plain; version=0.0.4; charset=utf-8")
            if self.path == "/v1/models":
                if not self._authorized():
                    return
                card = {"id": a.served_model_name or a.model_path, "object": "model", "created": int(time.time()),
                        "owned_by": "sglang", "root": a.model_path, "max_model_len": a.context_length or 262144}
                return self._send(200, json.dumps({"object": "list", "data": [card]}).encode())
            self._send(404, json.dumps({"detail": "Not Found"}).encode())

        def do_POST(self):
            if self.path != "/v1/chat/completions":
                return self._send(404, json.dumps({"detail": "Not Found"}).encode())
            if not self._authorized():
                return
            try:
                req = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
            except ValueError:
                return self._send(400, json.dumps({"error": {"message": "invalid JSON"}}).encode())
            name = a.served_model_name or a.model_path
            if req.get("model") and req["model"] != name:
                return self._send(404, json.dumps({"object": "error", "message": "The model `%s` does not exist."
                                                   % req["model"], "type": "NotFoundError", "code": 404}).encode())
            if k.get("chat_status"):
                return self._send(int(k["chat_status"]), json.dumps({"object": "error", "code": k["chat_status"],
                                                                     "message": "sandbox knob chat_status"}).encode())
            prompt = " ".join(str(m.get("content", "")) for m in req.get("messages", []))
            text = "" if k.get("empty_reply") else "Sandbox SGLang stand-in reply (%s): %s" % (
                "EAGLE-3 on" if metrics.spec else "no speculation", prompt[:40])
            gen = min(int(req.get("max_tokens") or 16), max(1, len(text.split()))) if text else 1
            metrics.completion(max(1, len(prompt.split())), gen)
            if metrics.spec:   # the scheduler's decode log line (metrics_reporter.py)
                log("Decode batch, #running-req: 1, #token: %d, token usage: 0.00, %s%.2f, accept rate: %.2f, "
                    "cuda graph: True, gen throughput (token/s): 42.00, #queue-req: 0"
                    % (gen, SRC.find("decode")[0], metrics.accept_length, metrics.accept_rate))
            body = {"id": "standin-%d" % int(time.time() * 1000), "object": "chat.completion",
                    "created": int(time.time()), "model": name,
                    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": gen,
                              "total_tokens": len(prompt.split()) + gen}}
            self._send(200, json.dumps(body).encode())

    H.api_key = api_key
    return H


def main(argv):
    p = argparse.ArgumentParser(prog="sglang serve")
    p.add_argument("cmd")
    for flag in ("--model-path", "--served-model-name", "--host", "--speculative-algorithm", "--config",
                 "--speculative-draft-model-path", "--attention-backend"):
        p.add_argument(flag)
    for flag in ("--port", "--tp-size", "--context-length", "--speculative-num-steps"):
        p.add_argument(flag, type=int)
    a, _unknown = p.parse_known_args(argv)
    k = base.knobs()
    if k.get("only_if_arg") is not None and k["only_if_arg"] not in argv:
        for knob in base.FAILURE_KNOBS:
            k.pop(knob, None)
    os.makedirs(base.STATE_DIR, exist_ok=True)
    with open(os.path.join(base.STATE_DIR, "argv.json"), "w") as f:
        json.dump({"argv": argv, "pid": PID, "started": time.time(), "engine": "sglang"}, f)
    log("SANDBOX: SGLang stand-in (SGLang %s's messages) serving %s" % (_version(), a.model_path), tp=False)
    ps = dict((ph, float(k["load_seconds"]) / len(PHASES)) for ph in PHASES)
    ps.update(k.get("phase_seconds") or {})
    spec = (a.speculative_algorithm or "").upper() == "EAGLE3"
    if not os.path.exists(os.path.join(a.model_path or "", "config.json")):
        sys.stdout.write("OSError: %s does not appear to have a file named config.json.\n" % a.model_path)
        sys.exit(1)
    shards = 64
    try:
        with open(os.path.join(a.model_path, "model.safetensors.index.json")) as f:
            shards = len(set(json.load(f)["weight_map"].values()))
    except (OSError, ValueError, KeyError):
        pass

    def phase(name):
        if k.get("stall_phase") == name:
            while True:
                time.sleep(3600)
        if k.get("crash_phase") == name:
            time.sleep(min(ps[name], 1.0))
            die(*CRASHES[name])

    desc = SRC.find("shards_desc")[0]
    t0 = time.time()
    log("Load weight begin. avail mem=93.12 GB")
    phase("weights")
    bar(desc, shards, ps["weights"])
    log("Load weight end. elapsed=%.2f s, type=KimiK25ForConditionalGeneration, avail mem=20.51 GB, "
        "mem usage=72.61 GB." % (time.time() - t0))
    if spec and not hook_present():   # configure_aux_hidden_state_capture, before the KV cache and graphs
        # the f-string's constant part after the class name: " does not implement set_eagle3_layers_to_capture, ..."
        die("ValueError", "Model KimiK25ForConditionalGeneration" + SRC.find("eagle3")[0])
    phase("kv_cache")
    time.sleep(ps["kv_cache"])
    log("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 418016, KV size: 11.42 GB")
    log("Memory pool end. avail mem=8.10 GB")
    phase("graphs")
    for role in ("target verify",) if spec else ("decode",):
        log("Capture %s CUDA graph begin. This can take up to several minutes. avail mem=8.10 GB" % role)
        time.sleep(ps["graphs"])
        log("Capture %s CUDA graph end. elapsed=%.2f s, mem usage=1.20 GB, avail mem=6.90 GB." % (role, ps["graphs"]))
    if spec:
        t1 = time.time()
        log("Load weight begin. avail mem=6.90 GB")
        phase("drafter")
        bar(desc, 1, ps["drafter"] / 2)
        drafter_class = "LlamaForCausalLMEagle3"
        try:
            with open(os.path.join(a.speculative_draft_model_path or "", "config.json")) as f:
                drafter_class = (json.load(f).get("architectures") or [drafter_class])[0]
        except (OSError, ValueError):
            pass
        log("Load weight end. elapsed=%.2f s, type=%s, avail mem=5.70 GB, mem usage=1.20 GB."
            % (time.time() - t1, drafter_class))
        for role in ("draft decode", "draft extend"):
            log("Capture %s CUDA graph begin. This can take up to several minutes. avail mem=5.70 GB" % role)
            time.sleep(ps["drafter"] / 4)
            log("Capture %s CUDA graph end. elapsed=%.2f s, mem usage=0.40 GB, avail mem=5.30 GB."
                % (role, ps["drafter"] / 4))
    phase("api")
    host, port = a.host or "127.0.0.1", a.port or 30000
    metrics = Metrics(a.served_model_name or a.model_path, a.speculative_num_steps or 3,
                      float(k.get("acceptance_rate", 0.6)), spec)
    metrics.no_drafts = bool(k.get("no_drafts"))
    srv = ThreadingHTTPServer((host, port), make_handler(a, metrics, api_key_of(a.config), k))
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
