"""deployer versions: what the measured release matrix says for Kimi-K2.5 + EAGLE-3 here (deployer/versions.py)."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated

import typer
import yaml

from deployer import engines
from deployer import versions as vs
from deployer.cli.targets import Json, die
from deployer.events import Exit

DEFAULTS = Path(__file__).resolve().parents[2] / "roles" / "deployer" / "defaults" / "main.yml"


def defaults() -> dict:
    """The deployer's default release per engine (roles/deployer/defaults/main.yml: the one source of settings)."""
    d = yaml.safe_load(DEFAULTS.read_text())
    return {"vLLM": str(d["deployer_vllm_version"]), "SGLang": str(d["deployer_sglang_version"])}


def versions(engine: Annotated[str, typer.Option("--engine", help="vllm, sglang or all.")] = "all",
             compute_cap: Annotated[str, typer.Option(
                 "--compute-cap", help="The GPUs' compute capability (nvidia-smi --query-gpu=compute_cap; preflight "
                                       "reads it on the host). 12.0: RTX PRO 6000 Blackwell.")] = "12.0",
             as_json: Json = False) -> None:
    """What every measured vLLM and SGLang release gives for Kimi-K2.5 + EAGLE-3 here: patched, native or refused,
    the evidence behind it, the recommended release and the default (docs/compatibility.md)."""
    known = engines.names()            # the registry's engines (deployer/engines), not a list kept here
    if engine != "all" and engine not in known:
        die(Exit.USAGE, f"--engine: got {engine!r}, expected {', '.join(known)} or all")
    if not re.fullmatch(r"\d+\.\d+", compute_cap):
        die(Exit.USAGE, f"--compute-cap: got {compute_cap!r}, expected MAJOR.MINOR as nvidia-smi prints it (12.0)")
    try:
        data = vs.load()
    except (OSError, ValueError) as e:
        die(Exit.FAILED, f"{vs.DATA}: {e} (regenerate: .venv/bin/python bench/compat_matrix.py)")
    rep = vs.report(data, compute_cap, defaults())
    want = {engines.get(n).label for n in (known if engine == "all" else [engine])}
    rep["rows"] = [r for r in rep["rows"] if r["engine"] in want]
    if as_json:
        sys.stdout.write(json.dumps(rep) + "\n")
        return
    w = sys.stdout.write
    w(f"measured {rep['generated']} at deployer commit {rep['commit']} (bench/compat_matrix.py); "
      f"GPUs of compute capability {rep['compute_cap']}\n")
    for eng in want:
        w(f"\n{eng}\n")
        before: list[str] = []
        for r in (x for x in rep["rows"] if x["engine"] == eng):
            marks = ", ".join(m for m, on in (("default", r["default"]), ("recommended", r.get("recommended")))
                              if on)
            w(f"  {r['version']:<14} {r['outcome']:<10} evidence: {r['evidence']:<9}"
              f"{'  <- ' + marks if marks else ''}\n")
            if r["outcome"] in ("refused", "unmeasured"):
                w(f"      {r['why']}\n")
            for n in r["notes"]:            # said where it starts to apply (rows go oldest first)
                if n.startswith("not installable here"):      # this release's own pins, not a change from here on
                    w(f"      {n}\n")
                elif n not in before:
                    w(f"      from here on: {n}\n")
            before = r["notes"]
        d, rec = rep["default"].get(eng), rep["recommended"].get(eng)
        w(f"  default {d}; recommended {rec or 'none (no supported release has run beyond its source)'}\n")
        if rec and d != rec:
            w(f"  (the default stays {d}: moving it changes every release id, and so restarts every host on its "
              f"next `up`; pin deployer_{eng.lower()}_version to choose: README, \"Engine versions\")\n")
    if rep["caveat"]:
        w(f"\n{rep['caveat']}\n")
