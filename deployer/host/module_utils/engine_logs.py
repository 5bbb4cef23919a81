# -*- coding: utf-8 -*-
"""Engine start-up log watch (vLLM, and SGLang with ``LoadState("sglang")``): which load phase the server is
in, how far, and whether it died; an ETA from the previous release's phases.

Pure and standard-library only: used on the host by the ``engine_watch`` module and on the controller by the CLI
and tests.  The phase rules are in load_rules.py, the fatal kinds in root_causes.py, line handling in log_lines.py.
tqdm redraws start with ``\\r`` (vLLM's shard bar also ends each redraw with a newline; the CUDA-graph bars do not):
``feed`` splits on both.  Unknown lines never raise; they are ignored.
"""
from __future__ import annotations

try:
    from ansible.module_utils.log_lines import split_lines, strip_prefix  # on the host
except ImportError:    # the controller
    from deployer.host.module_utils.log_lines import split_lines, strip_prefix
try:
    from ansible.module_utils.load_rules import RULES, RULESETS, RX  # on the host
except ImportError:    # the controller
    from deployer.host.module_utils.load_rules import RULES, RULESETS, RX
try:    # on the host
    from ansible.module_utils.root_causes import (
        ENGINE_GONE,
        GENERIC_FATAL,
        WARN,
        Unraisable,
        engine_process_spoke,
        fold_fatal,
        silent_death,
    )
except ImportError:    # the controller
    from deployer.host.module_utils.root_causes import (
        ENGINE_GONE,
        GENERIC_FATAL,
        WARN,
        Unraisable,
        engine_process_spoke,
        fold_fatal,
        silent_death,
    )

PHASES = ("starting", "weights", "drafter", "compile", "kv_cache", "graphs", "api", "ready")
PHASE_TITLES = {
    "starting": "starting", "weights": "loading weights", "drafter": "loading drafter",
    "compile": "torch.compile", "kv_cache": "KV cache sizing", "graphs": "CUDA graph capture",
    "api": "API server starting", "ready": "ready",
}
MAX_WARNINGS = 20


class LoadState(object):
    """Fold log lines into the current phase.  ``feed(line, t)`` with ``t`` seconds (any clock)."""

    def __init__(self, engine="vllm", eager=False):
        self.engine = engine
        self.eager = eager          # --enforce-eager: no torch.compile, no CUDA graphs (vLLM's config/vllm.py)
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

    def __getstate__(self):
        """Kept between the watch's calls (engine_watch.Follow): the rules are the engine's, named by ``engine``."""
        state = dict(self.__dict__)
        state.pop("rules", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.rules = RULESETS.get(self.engine, RULES)

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
        self.engine_spoke = self.engine_spoke or engine_process_spoke(raw)
        if not self.engine_gone and ENGINE_GONE.search(line):
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
