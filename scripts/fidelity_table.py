#!/usr/bin/env python3
"""Print the stand-in fidelity table (docs/standin-fidelity.md) from the prepared vLLM venvs.

    .venv/bin/python scripts/fidelity_table.py 0.16.0 0.18.0 0.33.0
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from deployer.sandbox import standin  # noqa: E402

CACHE = Path.home() / ".cache" / "deployer" / "venvs"
RULE = {"start": "start", "weights_took": "weights_took", "drafter": "drafter (phase)", "eagle3": "FATAL eagle3_interface",
        "model_took": "model_took", "cache_dir": "compile (phase)", "dynamo": "compile (phase)",
        "compile_miss": "compile_miss (fact compile_cache)", "compile_hit": "compile_hit (fact compile_cache)",
        "compile_total": "compile (fact compile_seconds)", "kv_mem": "kv (phase)", "kv_size": "kv (fact kv_cache_tokens)",
        "max_conc": "max_concurrency (phase end); 0.33: kv too", "graphs_desc": "graphs (progress)", "graphs_done": "graphs_done", "engine": "engine (phase api)",
        "engine_failed": "FATAL engine_dead (generic)", "init_failed": "FATAL engine_dead (generic)",
        "worker_died": "FATAL engine_dead (generic; status: last fatal)",
        "core_died": "FATAL engine_dead (generic; status: last fatal)",
        "api": "api (phase)", "bar_format": "shards (progress)", "shards_desc": "shards (progress)"}


def main(versions):
    srcs = []
    for v in versions:
        s = standin.VllmSource()
        s.root = str(CACHE / f"vllm-{v}" / "lib" / "python3.11" / "site-packages" / "vllm")
        srcs.append(s)
    print("| line | vLLM file | " + " | ".join(f"{v}: line, text" for v in versions) + " | parser rule |")
    print("|---|---|" + "---|" * len(versions) + "---|")
    for key, (rel, _a) in standin.MESSAGES.items():
        rel = " or ".join(f"vllm/{r}" for r in ((rel,) if isinstance(rel, str) else rel))
        cells = []
        for s in srcs:
            text, f, line = s.find(key)
            cells.append((f"{f}:{line}: `{text.strip()!r}`" if line else f"- (gone: {standin.GONE.get(key, '?')})")
                         .replace("|", "\\|"))
        print(f"| {key} | `{rel}` | " + " | ".join(cells) + f" | {RULE.get(key, '-')} |")


if __name__ == "__main__":
    main(sys.argv[1:] or ["0.16.0", "0.18.0", "0.33.0"])
