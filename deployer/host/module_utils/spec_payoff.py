# -*- coding: utf-8 -*-
"""Does EAGLE-3 pay on this host?  A release's smoke-measured tokens per second against the host's own release of
the same engine and model served the other way (with the drafter against without it).

On sm_120 EAGLE-3 may well be slower than no speculation (TRITON_MLA without full CUDA graphs; a Kimi-K2.5 verify
step of k+1 tokens routes to up to k+1 times the experts at batch 1, so it is not the free lunch it is on a dense
model): only a measurement on the host says which.  The smoke's greedy request is the same on both releases (the
same prompt, ``smoke_max_tokens``, one request alone), so the ratio of their tokens per second is the speed-up.

A verify step with the drafter makes ``mean_acceptance_length`` tokens (tau) in tau / tps_spec seconds; a step
without it makes one token in 1 / tps_plain.  EAGLE-3 pays when tps_spec > tps_plain, i.e. when tau exceeds the
break-even tau * tps_plain / tps_spec (the verify step's time over the plain step's).  Pure; stdlib only (it runs on
the host inside the release_flip module and on the controller for ``deployer releases``)."""
from __future__ import annotations

try:
    from ansible.module_utils.releases import order_key  # on the host
except ImportError:    # the controller
    from deployer.host.module_utils.releases import order_key


def _num(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f > 0 else None


def compare(release, others):
    """The speed-up of EAGLE-3 for ``release`` (a manifest with its smoke facts: ``speculative``, ``backend``,
    ``model_dir``, ``tokens_per_second``, ``mean_acceptance_length``) against the newest of ``others`` (the host's
    other manifests) that served the same backend and model the other way and recorded its tokens per second.
    None when either side has no measurement.  ``pays`` is True when EAGLE-3 made the greedy request faster."""
    tps = _num(release.get("tokens_per_second"))
    if tps is None or release.get("speculative") is None:
        return None
    spec = bool(release.get("speculative"))
    peers = [o for o in others if o.get("id") != release.get("id")
             and o.get("backend") == release.get("backend") and o.get("model_dir") == release.get("model_dir")
             and o.get("speculative") is not None and bool(o.get("speculative")) != spec
             and _num(o.get("tokens_per_second")) is not None]
    if not peers:
        return None
    peer = max(peers, key=order_key)
    s, p = (release, peer) if spec else (peer, release)
    tps_s, tps_p = _num(s["tokens_per_second"]), _num(p["tokens_per_second"])
    tau = _num(s.get("mean_acceptance_length"))
    speedup = tps_s / tps_p
    return {"speculative_release": s.get("id"), "plain_release": p.get("id"),
            "speculative_tokens_per_second": round(tps_s, 1), "plain_tokens_per_second": round(tps_p, 1),
            "speedup": round(speedup, 2), "pays": speedup >= 1.0,
            "mean_acceptance_length": round(tau, 2) if tau else None,
            # one verify step with the drafter, one decode step without it (ms)
            "step_ms": round(1000.0 * tau / tps_s, 1) if tau else None,
            "plain_step_ms": round(1000.0 / tps_p, 1),
            "break_even_acceptance_length": round(tau / speedup, 2) if tau else None}


def describe(payoff, speculative=True):
    """One line for a person: 'EAGLE-3 x0.81 (...) against no speculation (...): SLOWER than no speculation; ...'."""
    if not payoff:
        other = "false" if speculative else "true"
        return ("EAGLE-3's gain is unmeasured: this host has no release of the same engine and model served the other "
                f"way (one deployed with -e deployer_speculative_enabled={other} measures it)")
    tau, even = payoff.get("mean_acceptance_length"), payoff.get("break_even_acceptance_length")
    steps = (f"; a verify step {payoff['step_ms']} ms for {tau} tokens, a plain step {payoff['plain_step_ms']} ms: "
             f"break-even at a mean acceptance length of {even}") if tau else ""
    return (f"EAGLE-3 x{payoff['speedup']:.2f} ({payoff['speculative_tokens_per_second']} tokens/s, release "
            f"{payoff['speculative_release']}) against no speculation ({payoff['plain_tokens_per_second']} tokens/s, "
            f"release {payoff['plain_release']}): {'it pays' if payoff['pays'] else 'SLOWER than no speculation'}"
            f"{steps}")
