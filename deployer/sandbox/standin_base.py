"""SANDBOX ONLY: what both engine stand-ins share (vllm_standin.py plays vLLM, sglang_standin.py SGLang).

Copied beside them onto a sandbox host (deployer/sandbox/image.py), where each imports it as ``standin_base``
(a script's own directory is first on its import path); in the repository it is ``deployer.sandbox.standin_base``.
Here: the rehearsal knobs (/etc/deployer-sandbox/standin.json), the stand-in's state directory, the engine's own
message texts read from its installed source (``EngineSource``) and the CUDA-side failures both engines die of
(their HTTP API is standin_api.py).  Standard library only.
"""
import ast
import importlib.util
import json
import os
import re
import sys
import time

KNOBS_FILE = os.environ.get("DEPLOYER_STANDIN_KNOBS", "/etc/deployer-sandbox/standin.json")
STATE_DIR = os.environ.get("DEPLOYER_STANDIN_STATE", "/run/deployer-standin")


def knobs():
    k = {"load_seconds": 4.0, "crash_phase": None, "stall_phase": None, "phase_seconds": {},
         "acceptance_rate": 0.6, "crash_after_ready_seconds": None}
    try:
        with open(KNOBS_FILE) as f:
            k.update(json.load(f))
    except (OSError, ValueError):
        pass
    return k


class Start(object):
    """One start of a stand-in: its knobs (the failure knobs dropped when ``only_if_arg`` names no word of this
    argv), each phase's seconds (``load_seconds`` shared evenly, ``phase_seconds`` over it), and argv.json in the
    state directory (what the tests read back: the argv, the pid, when it started)."""

    def __init__(self, argv, phases, **record):
        k = knobs()
        if k.get("only_if_arg") is not None and k["only_if_arg"] not in argv:
            for knob in FAILURE_KNOBS:
                k.pop(knob, None)
        self.knobs = k
        self.seconds = dict((ph, float(k["load_seconds"]) / len(phases)) for ph in phases)
        self.seconds.update(k.get("phase_seconds") or {})
        os.makedirs(STATE_DIR, exist_ok=True)
        with open(os.path.join(STATE_DIR, "argv.json"), "w") as f:
            json.dump(dict({"argv": argv, "pid": os.getpid(), "started": time.time()}, **record), f)

    @staticmethod
    def hang():
        """Silent for good, the process alive (an NCCL deadlock, a wedged rank)."""
        while True:
            time.sleep(3600)


def model_shards(model_dir):
    """The number of safetensors shards the model's index names (64 when it cannot be read); a directory without
    config.json ends the start with the OSError line both engines print (transformers' words)."""
    if not os.path.exists(os.path.join(model_dir or "", "config.json")):
        sys.stdout.write("OSError: %s does not appear to have a file named config.json.\n" % model_dir)
        sys.exit(1)
    try:
        with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
            return len(set(json.load(f)["weight_map"].values()))
    except (OSError, ValueError, KeyError):
        return 64


# ------------------------------------------------------------------ the engine's own words, from its source
PLACEHOLDER = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdifrx]")


class EngineSource(object):
    """Message text and [file:line] read from the installed engine's source with ``ast`` (no import of it):
    ``package`` is the engine's package (vllm, sglang), ``messages`` key -> (file(s) under it, anchors), ``fallback``
    key -> the text used when the engine is not importable (the stand-in run by hand) or lacks the message."""

    def __init__(self, package, messages, fallback):
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        self.root = os.path.dirname(spec.origin) if spec and spec.origin else None
        self.messages, self.fallback = messages, fallback
        self.cache, self.parsed = {}, {}

    def _constants(self, rel):
        """(text, line of the call that holds it) of every string constant in <package>/<rel>; each file is parsed
        once per start (several messages live in gpu_model_runner.py, ~6,000 lines)."""
        if rel in self.parsed:
            return self.parsed[rel]
        self.parsed[rel] = []
        try:
            with open(os.path.join(self.root, rel)) as f:
                tree = ast.parse(f.read())
        except (OSError, SyntaxError):
            return []
        parents = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                parents[child] = node
        out = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                up = parents.get(node)
                while up is not None and not isinstance(up, ast.Call) and not isinstance(up, ast.stmt):
                    up = parents.get(up)
                out.append((node.value, up.lineno if isinstance(up, ast.Call) else node.lineno))
        self.parsed[rel] = out
        return out

    def find(self, key):
        """(text, 'file.py', line) for a MESSAGES key: the anchors in their order, each tried in every file named
        (a message that moved between releases), the first line holding it; the fallback text with line 0 when
        the engine is not installed, or when this release has no such message (``has``)."""
        if key in self.cache:
            return self.cache[key]
        rels, anchors = self.messages[key]
        rels = (rels,) if isinstance(rels, str) else tuple(rels)
        found = None
        if self.root:
            consts = [(rel, self._constants(rel)) for rel in rels]
            for a in anchors:
                hits = [(line, text, rel) for rel, cs in consts for text, line in cs if a in text]
                if hits:
                    line, text, rel = min(hits)
                    found = (text, os.path.basename(rel), line)
                    break
        if found is None:
            found = (self.fallback[key], os.path.basename(rels[0]), 0)
        self.cache[key] = found
        return found

    def has(self, key):
        """Does this release print that message (always, when the engine is not installed)?"""
        return not self.root or self.find(key)[2] > 0

    def text(self, key, *args):
        """The message with ``args`` put in (as many as its placeholders take)."""
        fmt = self.find(key)[0]
        n = len(PLACEHOLDER.findall(fmt))
        return fmt % args[:n] if n else fmt


def mark(name):
    """Rehearsal bookkeeping for the benchmarks: when did the stand-in die / become ready."""
    try:
        with open(os.path.join(STATE_DIR, name), "w") as f:
            f.write("%.6f\n" % time.time())
    except OSError:
        pass


# How the CUDA side of a load fails, by phase (torch, inductor and NCCL errors: the same under either engine).
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
# The knobs that make a start fail (only_if_arg limits them to an argv that holds its word).
FAILURE_KNOBS = ("crash_phase", "stall_phase", "crash_after_ready_seconds", "unhealthy_after_ready_seconds",
                 "hang_after_ready_seconds", "chat_status", "empty_reply", "no_drafts", "fatal_line_phase")
