"""SANDBOX ONLY: how the vLLM stand-in (vllm_standin.py) speaks: vLLM's own message texts and their [file:line],
read from the installed vLLM's source (``VllmSource``: AST, no import of vLLM), and vLLM's output decoration: the
per-process ``(Worker_TP0 pid=N) `` prefix, the log header, the real tqdm bars, and how a failed start reads.
Copied beside the stand-ins onto a sandbox host.  Standard library, plus the venv's own tqdm (a vLLM dependency).
"""
import os
import sys
import time

try:
    import standin_base as base  # on a sandbox host, or run as a script: the file beside this one
except ImportError:  # imported from the repository
    from deployer.sandbox import standin_base as base

PID = os.getpid()


# ------------------------------------------------------------------ vLLM's own words, from its source
# key -> (file under vllm/, anchors): the first string constant in that file containing an anchor is the
# message; the line of the logger call that holds it is the [file:line] of the log header.
MESSAGES = {
    "start": ("v1/worker/gpu_model_runner.py", ("Starting to load model",)),
    "weights_took": ("model_executor/model_loader/default_loader.py", ("Loading weights took",)),
    "drafter": ("v1/worker/gpu_model_runner.py", ("Loading drafter model",)),
    "eagle3": ("v1/worker/gpu_model_runner.py", ("Model does not support EAGLE3 interface",)),
    "model_took": ("v1/worker/gpu_model_runner.py", ("Model loading took",)),
    "cache_dir": ("compilation/backends.py", ("Using cache directory",)),
    "dynamo": ("compilation/backends.py", ("Dynamo bytecode transform time",)),
    "compile_miss": ("compilation/backends.py", ("Compiling a graph for compile range",)),
    "compile_hit": ("compilation/backends.py", ("Directly load the compiled graph",)),
    "compile_total": ("compilation/monitor.py", ("s in total",)),
    "kv_mem": ("v1/worker/gpu_worker.py", ("Available KV cache memory",)),
    "kv_size": ("v1/core/kv_cache_utils.py", ("GPU KV cache size: ",)),
    "max_conc": ("v1/core/kv_cache_utils.py", ("Maximum concurrency for",)),
    # --enforce-eager: compilation off (no torch.compile lines) and no CUDA graphs (config/vllm.py), said once
    "eager": ("config/vllm.py", ("Cudagraph is disabled under eager mode",)),
    "graphs_desc": ("v1/worker/gpu_model_runner.py", ("Capturing CUDA graphs (",)),
    "graphs_done": ("v1/worker/gpu_model_runner.py", ("Graph capturing finished in",)),
    # Model Runner V2 (v1/worker/gpu/; opt-in from 0.16, the only runner from 0.34): its own lines and order
    "start_v2": ("v1/worker/gpu/model_runner.py", ("Loading model from scratch",)),
    "eagle3_aux_v2": ("v1/worker/gpu/spec_decode/eagle/eagle3_utils.py", ("Using Eagle3 auxiliary layers from model",)),
    "eagle3_aux_cfg_v2": ("v1/worker/gpu/spec_decode/eagle/eagle3_utils.py",
                          ("Using Eagle3 auxiliary layers from config",)),
    "eagle3_v2": ("v1/worker/gpu/spec_decode/eagle/eagle3_utils.py", ("Model does not support EAGLE3 interface",)),
    "model_took_v2": ("v1/worker/gpu/model_runner.py", ("Model loading took",)),
    "graphs_desc_v2": ("v1/worker/gpu/cudagraph_utils.py", ("Capturing CUDA graphs",)),
    "graphs_done_v2": ("v1/worker/gpu/model_runner.py", ("Graph capturing finished in",)),
    # 0.20+: "... took %.2f s (compilation: %.2f s)"; 0.33 puts a variant for models with a compiled encoder first
    "engine": ("v1/engine/core.py", ("%.2f s (compilation: %.2f s)", "init engine (profile")),
    "engine_failed": ("v1/engine/core.py", ("EngineCore failed to start",)),
    "init_failed": ("v1/engine/utils.py", ("Engine core initialization failed",)),
    "worker_died": ("v1/executor/multiproc_executor.py", ("died unexpectedly, shutting down executor",
                                                          "died unexpectedly (exit code: ")),
    "core_died": ("v1/engine/core_client.py", ("died unexpectedly, shutting down client",)),
    "api": (("entrypoints/openai/api_server.py", "entrypoints/launchers/api_server/entry.py"),   # moved in 0.33
            ("Starting vLLM API server", "Starting vLLM server on")),
    "bar_format": ("model_executor/model_loader/weight_utils.py", ("% Completed |",)),
    "shards_desc": ("model_executor/model_loader/weight_utils.py", ("Loading safetensors checkpoint shards",)),
}
# Messages a newer vLLM no longer prints on their own, and what says it instead (the fidelity test allows only
# these to be missing from an installed source).
GONE = {
    # 0.34: the V1 GPU runner (v1/worker/gpu_model_runner.py) is gone; Model Runner V2 says these (the *_v2 keys)
    "start": "0.34: Model Runner V2 only: 'Loading model from scratch...' (start_v2)",
    "drafter": "0.34: Model Runner V2 loads the drafter without a line of its own (after eagle3_aux_v2)",
    "eagle3": "0.34: eagle3_v2, in v1/worker/gpu/spec_decode/eagle/eagle3_utils.py",
    "model_took": "0.34: model_took_v2", "graphs_desc": "0.34: graphs_desc_v2", "graphs_done": "0.34: graphs_done_v2",
    "kv_size": "0.33: one line with max_conc, '%s KV cache size: %s tokens, Maximum concurrency for ...'",
    "core_died": "0.33: the client raises 'Engine core process ... died unexpectedly.' instead (v1/utils.py)",
}
# Messages an older vLLM does not print yet (its Model Runner V2 had no EAGLE-3 support; the stand-in speaks V2 only
# where the V1 runner is gone, from 0.34).
NOT_YET = {k: "Model Runner V2's EAGLE-3 lines: not in 0.16's v1/worker/gpu/" for k in
           ("eagle3_aux_v2", "eagle3_aux_cfg_v2", "eagle3_v2")}
# Only when no vLLM is importable (the stand-in run by hand): vLLM 0.16.0's text.
FALLBACK = {
    "start": "Starting to load model %s...", "weights_took": "Loading weights took %.2f seconds",
    "drafter": "Loading drafter model...",
    "eagle3": "Model does not support EAGLE3 interface but aux_hidden_state_outputs was requested",
    "model_took": "Model loading took %s GiB memory and %.6f seconds",
    "cache_dir": "Using cache directory: %s for vLLM's torch.compile",
    "dynamo": "Dynamo bytecode transform time: %.2f s",
    "compile_miss": "Compiling a graph for compile range %s takes %.2f s",
    "compile_hit": "Directly load the compiled graph(s) for compile range %s from the cache, took %.3f s",
    "compile_total": "torch.compile takes %.2f s in total", "kv_mem": "Available KV cache memory: %s GiB",
    "kv_size": "GPU KV cache size: %s tokens", "max_conc": "Maximum concurrency for %s tokens per request: %.2fx",
    "eager": "Cudagraph is disabled under eager mode",
    "graphs_desc": "Capturing CUDA graphs ({}, {})",
    "graphs_done": "Graph capturing finished in %.0f secs, took %.2f GiB",
    "start_v2": "Loading model from scratch...", "eagle3_aux_v2": "Using Eagle3 auxiliary layers from model: %s",
    "eagle3_aux_cfg_v2": "Using Eagle3 auxiliary layers from config: %s",
    "eagle3_v2": "Model does not support EAGLE3 interface",
    "model_took_v2": "Model loading took %s GiB memory and %.6f seconds",
    "graphs_desc_v2": "Capturing CUDA graphs", "graphs_done_v2": "Graph capturing finished in %.0f secs, took %.2f GiB",
    "engine": "init engine (profile, create kv cache, warmup model) took %.2f seconds",
    "engine_failed": "EngineCore failed to start.",
    "init_failed": "Engine core initialization failed. See root cause above. Failed core proc(s): ",
    "worker_died": "Worker proc %s died unexpectedly, shutting down executor.",
    "core_died": "Engine core proc %s died unexpectedly, shutting down client.",
    "api": "Starting vLLM API server %d on %s",
    "bar_format": "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]\n",
    "shards_desc": "Loading safetensors checkpoint shards",
}


class VllmSource(base.EngineSource):
    """vLLM's messages (MESSAGES), with the argument quirks of its releases."""

    def __init__(self):
        super().__init__("vllm", MESSAGES, FALLBACK)

    def text(self, key, *args):
        fmt = self.find(key)[0]
        n = len(base.PLACEHOLDER.findall(fmt))
        if key == "api" and n == 1:      # 0.18+: "Starting vLLM server on %s" (no server index)
            args = args[1:]
        if fmt.startswith("%s") and n == len(args) + 1:
            # 0.33+: compile messages lead with the backend's log prefix, "[backbone] " for the target model
            # (VllmBackend._log_prefix: "[<prefix or model_tag>] ", compilation/backends.py); the stand-in
            # compiles only the target
            args = ("[backbone] ",) + tuple(args)
        return fmt % args[:n] if n else fmt


SRC = VllmSource()


class Prefixed(object):
    """vLLM's per-process output decoration (``_add_prefix``, vllm/utils/system_utils.py): the
    ``(Worker_TP0 pid=N) `` prefix (no colour when not a terminal) written at every line start."""

    def __init__(self, raw, name):
        self.raw, self.prefix, self.start_new_line = raw, "(%s pid=%d) " % (name, PID), True

    def write(self, s):
        if not s:
            return
        if self.start_new_line:
            self.raw.write(self.prefix)
        idx = 0
        while True:
            nxt = s.find("\n", idx)
            if nxt == -1:
                break
            nxt += 1
            self.raw.write(s[idx:nxt])
            if nxt == len(s):
                self.start_new_line = True
                return
            self.raw.write(self.prefix)
            idx = nxt
        self.raw.write(s[idx:])
        self.start_new_line = False

    def flush(self):
        self.raw.flush()

    def isatty(self):
        return False


OUT = {}


def stream(who, err=False):
    key = (who, err)
    if key not in OUT:
        OUT[key] = Prefixed(sys.stderr if err else sys.stdout, who)
    return OUT[key]


def log(key, *args, **kw):
    """One line in vLLM's format: ``LEVEL MM-DD HH:MM:SS [file.py:line] message`` behind the process prefix."""
    who, level = kw.get("who", "Worker_TP0"), kw.get("level", "INFO")
    text = kw["raw"] if "raw" in kw else SRC.text(key, *args)
    _fmt, fname, line = SRC.find(key) if key else ("", kw.get("where", "vllm_standin.py"), 0)
    out = stream(who)
    out.write("%s %s [%s:%d] %s\n" % (level, time.strftime("%m-%d %H:%M:%S"), fname, line, text))
    out.flush()


def bar(desc, total, seconds, bar_format=None, stop_at=None):
    """The real tqdm of this venv, as vLLM calls it (shards: its _BAR_FORMAT; CUDA graphs: tqdm's default)."""
    out = stream("Worker_TP0", err=True)
    steps = total if stop_at is None else stop_at
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is None:  # no venv: a plain rendering of the same format
        fmt = bar_format or "{desc}: {n}/{total}\n"
        for n in range(steps + 1):
            out.write("\r" + fmt.replace("{percentage:3.0f}", "%3.0f" % (100.0 * n / total)).format(
                desc=desc, n_fmt=n, total_fmt=total, n=n, total=total, elapsed="00:00", remaining="00:00",
                rate_fmt="0.00it/s"))
            out.flush()
            time.sleep(seconds / max(1, total))
        return
    kw = {"bar_format": bar_format} if bar_format else {}
    t = tqdm(total=total, desc=desc, file=out, mininterval=0, **kw)
    for _ in range(steps):
        time.sleep(seconds / max(1, total))
        t.update(1)
    if stop_at is None:
        t.close()
    else:
        out.flush()


def die(exc_type, message, where="vllm/v1/worker/gpu_model_runner.py", func="load_model"):
    """How a failed engine start reads: EngineCore's exception log, the traceback ending in the root
    cause, then the API server's own RuntimeError."""
    log("engine_failed", who="EngineCore_DP0", level="ERROR")
    core = stream("EngineCore_DP0")
    core.write("Traceback (most recent call last):\n")
    core.write('  File "%s", line 1, in %s\n' % (where, func))
    core.write("%s: %s\n" % (exc_type, message))
    core.flush()
    api = stream("APIServer")
    api.write("RuntimeError: %s{}\n" % SRC.text("init_failed"))
    api.flush()
    base.mark("died_at")
    sys.exit(1)
