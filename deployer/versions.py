"""What the measured engine-release matrix says for a deploy of Kimi-K2.5 + EAGLE-3 on given GPUs (``deployer
versions``).  Pure: it reads ``deployer/data/compatibility.json``, which ``bench/compat_matrix.py`` writes from each
release's own wheel together with docs/compatibility.md, and the evidence of where each release has run (the CI
tiers ``scripts/dev.sh`` prepares, the real-GPU recordings under ``tests/fixtures/real-gpu``).

A verdict per release: ``refused`` (the patch engine cannot make its EAGLE-3 path serve this model, or the verify
script would not import), ``patched`` (supported with the deployer's patches) or ``native``; the ``evidence`` that
backs it, strongest first: ``real GPU`` (a real engine loaded and served on that compute capability), ``other GPU``
(a real engine on another compute capability: it proves the engine, not these kernels), ``real CPU`` (the release's
own source built for CPUs, deployed by the real-engine sandbox and serving on every CI run: it proves the engine's
Python paths, not its GPU kernels), ``sandbox`` (deployed in the sandbox on the stand-in, the release's own checks on
the rendered argv, on every CI run), ``source`` (only read).
``recommended`` is the newest supported release with at least sandbox evidence whose pinned dependencies the package
index has; on GPUs no release has run on, the verdict says so instead of pretending.
"""
from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "compatibility.json"
EVIDENCE_RANK = {"real GPU": 5, "other GPU": 4, "real CPU": 3, "sandbox": 2, "source": 1}


def load(path: Path = DATA) -> dict:
    return json.loads(Path(path).read_text())


def vtuple(v: str) -> tuple:
    """A release (or driver) version as numbers, each dot-separated part's digits: 0.5.12.post1 -> (0, 5, 12, 1),
    570.124.06 -> (570, 124, 6).  The one version parser of the controller (filter version_tuple, the matrix)."""
    out = []
    for part in str(v).split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def verdict(row: dict) -> tuple[str, str]:
    """(outcome, why) for one measured row."""
    if row.get("error"):
        return "unmeasured", row["error"]
    if row["engine"] == "SGLang":
        cap = row.get("capability") or {}
        if cap.get("refused") or cap.get("problems"):
            return "refused", cap.get("refused") or "; ".join(cap["problems"])
        return "native", "Kimi-K2.5 class, EAGLE-3 hook and drafter class in its source"
    if row.get("verifier_missing"):
        return "refused", "the verify script imports what this release lacks: " + ", ".join(row["verifier_missing"])
    patch = str(row.get("patch", ""))
    if patch.startswith("refused"):
        return "refused", patch.split(":", 1)[-1].strip()
    if patch.startswith("patched"):
        return "patched", patch
    return "native", "EAGLE-3 for Kimi-K2.5 in its own source"


def notes(row: dict) -> list[str]:
    """What an operator of this release should know (from the measured columns)."""
    out = []
    if row.get("install", "ok") != "ok":   # its pinned dependencies, resolved against the index (bench/compat_matrix)
        out.append(row["install"])
    if row["engine"] != "vLLM" or row.get("error"):
        return out
    if row.get("eagle3_target_check") is False:
        out.append("vLLM no longer refuses an unsupported EAGLE-3 target before the load: the deployer's "
                   "preflight is the only early check")
    if row.get("model_runner_v2_default") == "auto":
        out.append("Model Runner V2 may be chosen (VLLM_USE_V2_MODEL_RUNNER=0 goes back)")
    if row.get("aux_ids") == "top-level only":
        out.append("reads only a top-level eagle_aux_hidden_state_layer_ids (the drafter check follows it)")
    k = row.get("kernels_sm120")
    if k and k.get("ptx_only"):
        out.append(f"on sm_120 its kernels need driver >= {k['driver']}: {k['ptx_only']} CUDA units carry only PTX "
                   f"ISA {k['ptx_isa']} ({', '.join(k['libraries'])}); the verify stage reads the installed wheel")
    return out


def evidence_for(engine: str, version: str, compute_cap: str, evidence: dict) -> tuple[str, list[str]]:
    """(strongest evidence, each piece of it) for a release on GPUs of ``compute_cap``."""
    found = []
    for run in evidence.get("real_gpu", []):
        if run["engine"] == engine and run["version"] == version:
            here = str(run.get("compute_cap")) == str(compute_cap)
            found.append(("real GPU" if here else "other GPU",
                          f"a real engine on {run['gpu']} (compute capability {run.get('compute_cap')}): "
                          f"tests/fixtures/real-gpu/{run['dir']}"))
    for run in evidence.get("real_cpu", []):
        if run["engine"] == engine and run["version"] == version:
            found.append(("real CPU", f"the real engine's own source, built for CPUs ({run['build']}), deployed and "
                                      f"serving in the sandbox on every CI run: tests/fixtures/real-cpu/{run['dir']}"))
    if version in evidence.get("ci", {}).get(engine, []):
        found.append(("sandbox", "deployed in the sandbox, verified by its own checks, on every CI run"))
    if not found:
        return "source", ["read from its wheel only"]
    found.sort(key=lambda f: -EVIDENCE_RANK[f[0]])
    return found[0][0], [w for _k, w in found]


def report(data: dict, compute_cap: str = "12.0", default: dict | None = None) -> dict:
    """Rows for every measured release of both engines, the recommendation per engine and the defaults."""
    default = default or {}
    rows = []
    for r in data["rows"]:
        outcome, why = verdict(r)
        ev, where = evidence_for(r["engine"], r["version"], compute_cap, data.get("evidence", {}))
        rows.append({"engine": r["engine"], "version": r["version"], "outcome": outcome, "why": why,
                     "evidence": ev, "where": where, "notes": notes(r), "installable": r.get("install", "ok") == "ok",
                     "default": default.get(r["engine"]) == r["version"]})
    recommended = {}
    for engine in sorted({r["engine"] for r in rows}):
        ok = [r for r in rows if r["engine"] == engine and r["outcome"] in ("patched", "native")
              and EVIDENCE_RANK[r["evidence"]] >= EVIDENCE_RANK["sandbox"] and r["installable"]]
        if ok:
            best = max(ok, key=lambda r: vtuple(r["version"]))
            recommended[engine] = best["version"]
            best["recommended"] = True
    on_these = [r for r in rows if r["evidence"] == "real GPU"]
    return {"compute_cap": str(compute_cap), "generated": data.get("generated"), "commit": data.get("commit"),
            "rows": rows, "recommended": recommended, "default": default,
            "untested_here": not on_these,
            "caveat": "" if on_these else (f"no release has run on compute capability {compute_cap} GPUs: "
                                           "the verdicts come from source, the sandbox and other GPUs")}


def measured_refusal(engine: str, version: str, path: Path | None = None) -> str:
    """Why the measured matrix refuses exactly this release ("" when it does not, or has no row for it): the plan
    refuses it before anything is installed (a refused vLLM was found only by the patch stage, after a ~10 GB
    install).  A release newer than the measurement has no row: the patch engine decides on its real files."""
    data = _cached(str(path or DATA))
    for r in data["rows"]:
        if r["engine"] == engine and r["version"] == version:
            outcome, why = verdict(r)
            why = why.removeprefix(f"{engine} {version}: ")
            if outcome == "refused":
                return (f"{engine} {version} cannot serve Kimi-K2.5 with EAGLE-3 as measured from its own wheel "
                        f"(deployer versions; docs/compatibility.md, deployer commit {data.get('commit', '?')}): "
                        f"{why}. Choose a release `deployer versions` supports (deployer_{engine.lower()}_version)")
            return ""
    return ""


_LOADED: dict = {}


def _cached(path: str) -> dict:
    if path not in _LOADED:
        _LOADED[path] = load(Path(path))
    return _LOADED[path]
