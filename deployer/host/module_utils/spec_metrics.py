# -*- coding: utf-8 -*-
"""Speculative decoding's counters from an engine's ``/metrics`` (Prometheus text), read by the rules its engine
names (``metrics_rules``, deployer/engines): the smoke test's proof that EAGLE-3 drafts and its acceptance rate,
``deployer status``'s and ``deployer releases``' figures.  Pure and standard-library only (host and controller)."""
from __future__ import annotations

import re


def parse_prometheus(text):
    """Prometheus text format -> {name: [(labels dict, value)]}.  Comments and bad lines skipped."""
    out = {}
    rx = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+([-+0-9.eEinfNa]+)(?:\s+\d+)?$')
    lab = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = rx.match(line.strip())
        if not m:
            continue
        try:
            val = float(m.group(3))
        except ValueError:
            continue
        out.setdefault(m.group(1), []).append((dict(lab.findall(m.group(2) or "")), val))
    return out


def spec_decode_stats(text, draft_tokens_per_step=None, rules=None):
    """EAGLE-3 counters from /metrics (summed over engines) and the derived rates, in vLLM's fields whatever the
    engine.  ``draft_tokens_per_step``: the drafts each verify step proposes (the plan's; SGLang's counters do not
    say it).  ``rules``: the engine's ``metrics_rules`` (a key of ``RULES``, deployer/engines); None: the rules
    whose metrics the text holds (``deployer status`` of a release whose engine it reads from the text).  An
    unknown key raises: an engine's metrics are never silently read as absent."""
    m = parse_prometheus(text)
    if rules is None:
        rules = next((k for k, (marks, _f) in RULES.items() if any(n in m for n in marks)), "vllm")
    if rules not in RULES:
        raise ValueError("metrics rules: got %r, expected one of %s" % (rules, sorted(RULES)))
    return RULES[rules][1](m, lambda name: sum(v for _l, v in m.get(name, [])), draft_tokens_per_step)


def _vllm_spec_stats(m, total, draft_tokens_per_step):
    """vLLM's own counters (vllm/v1/spec_decode/metrics.py): drafts, draft tokens, accepted, accepted per position."""
    drafts = total("vllm:spec_decode_num_drafts_total")
    draft_tokens = total("vllm:spec_decode_num_draft_tokens_total")
    accepted = total("vllm:spec_decode_num_accepted_tokens_total")
    per_pos = {}
    for labels, v in m.get("vllm:spec_decode_num_accepted_tokens_per_pos_total", []):
        per_pos[labels.get("position", "?")] = per_pos.get(labels.get("position", "?"), 0.0) + v
    present = "vllm:spec_decode_num_drafts_total" in m
    return {
        "present": present,
        "num_drafts": drafts,
        "num_draft_tokens": draft_tokens,
        "num_accepted_tokens": accepted,
        "acceptance_rate": round(accepted / draft_tokens, 4) if draft_tokens else None,
        "mean_acceptance_length": round(1 + accepted / drafts, 4) if drafts else None,
        "per_position_rate": {k: round(v / drafts, 4) for k, v in sorted(per_pos.items())} if drafts else {},
    }


def _sglang_spec_stats(m, total, draft_tokens_per_step):
    """SGLang 0.5.23 (srt/observability/metrics_collector.py) in vLLM's fields, from its COUNTERS, which every
    finished request adds to: verify steps (``spec_verify_calls_total``: vLLM's drafts), output tokens
    (``generation_tokens_total``) and requests (``num_requests_total``: each request's first token comes from its
    prefill, not from a verify step).  A verify step yields its accepted drafts plus one token, so accepted =
    tokens - requests - steps and proposed = steps x drafts per step.  Its GAUGES ``spec_accept_length`` /
    ``spec_accept_rate`` are set only every ``decode_log_interval`` (40) decode steps
    (scheduler_components/metrics_reporter.py): on a fresh server a short request leaves them at 0, so they are
    only the fallback (rank 0's) when no counter moved or the drafts per step are unknown."""
    def gauge(name):
        vals = [(str(lab.get("tp_rank", "0")) != "0", v) for lab, v in m.get(name, [])]
        return sorted(vals)[0][1] if vals else None
    verify = total("sglang:spec_verify_calls_total")
    steps = verify if "sglang:generation_tokens_total" in m else 0.0
    accepted = max(0.0, total("sglang:generation_tokens_total") - total("sglang:num_requests_total") - steps)
    k = float(draft_tokens_per_step or 0)
    out = {"present": True, "engine": "sglang", "num_drafts": verify,
           "num_draft_tokens": steps * k, "num_accepted_tokens": accepted if steps else 0.0,
           "acceptance_rate": round(accepted / (steps * k), 4) if steps and k else None,
           "mean_acceptance_length": round(1 + accepted / steps, 4) if steps else None,
           "per_position_rate": {}, "source": "counters"}
    if out["acceptance_rate"] is None:
        length, rate = gauge("sglang:spec_accept_length"), gauge("sglang:spec_accept_rate")
        out.update(acceptance_rate=round(rate, 4) if rate else None, source="gauges",
                   mean_acceptance_length=out["mean_acceptance_length"] or (round(length, 4) if length else None))
    return out


# metrics rules: key -> (metric names that say a text is this engine's, the reader)
RULES = {
    "vllm": (("vllm:spec_decode_num_drafts_total",), _vllm_spec_stats),
    "sglang": (("sglang:spec_verify_calls_total", "sglang:spec_accept_length"), _sglang_spec_stats),
}


def spec_decode_delta(before, after):
    """Rates over the interval between two ``spec_decode_stats`` snapshots (SGLang's in the same fields)."""
    if after.get("source") == "gauges":      # SGLang without the drafts per step: its gauges' recent window
        return {"drafts": after["num_drafts"] - before.get("num_drafts", 0.0), "draft_tokens": None,
                "accepted_tokens": None, "acceptance_rate": after["acceptance_rate"],
                "mean_acceptance_length": after["mean_acceptance_length"]}
    d = after["num_drafts"] - before["num_drafts"]
    dt = after["num_draft_tokens"] - before["num_draft_tokens"]
    da = after["num_accepted_tokens"] - before["num_accepted_tokens"]
    return {
        "drafts": d, "draft_tokens": dt, "accepted_tokens": da,
        "acceptance_rate": round(da / dt, 4) if dt > 0 else None,
        "mean_acceptance_length": round(1 + da / d, 4) if d > 0 else None,
    }
