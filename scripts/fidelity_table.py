#!/usr/bin/env python3
"""Print the stand-in fidelity table (docs/standin-fidelity.md) from the prepared vLLM venvs, or SGLang's.

    .venv/bin/python scripts/fidelity_table.py 0.16.0 0.18.0 0.33.0
    .venv/bin/python scripts/fidelity_table.py --sglang 0.5.23
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from deployer.sandbox import sglang_standin, standin_base  # noqa: E402
from deployer.sandbox import vllm_standin_log as standin  # noqa: E402

CACHE = Path.home() / ".cache" / "deployer" / "venvs"
RULE = {"start": "start", "weights_took": "weights_took", "drafter": "drafter (phase)",
        "start_v2": "start (fact model_runner v2)", "eagle3_aux_v2": "drafter (phase)",
        "eagle3_aux_cfg_v2": "drafter (phase)", "eagle3_v2": "FATAL eagle3_interface", "model_took_v2": "model_took",
        "graphs_desc_v2": "graphs (progress)", "graphs_done_v2": "graphs_done",
        "eagle3": "FATAL eagle3_interface",
        "model_took": "model_took", "cache_dir": "compile (phase)", "dynamo": "compile (phase)",
        "compile_miss": "compile_miss (fact compile_cache)", "compile_hit": "compile_hit (fact compile_cache)",
        "compile_total": "compile (fact compile_seconds)", "kv_mem": "kv (phase)",
        "kv_size": "kv (fact kv_cache_tokens)", "max_conc": "max_concurrency (phase end); 0.33: kv too",
        "graphs_desc": "graphs (progress)", "graphs_done": "graphs_done", "engine": "engine (phase api)",
        "engine_failed": "FATAL engine_dead (generic)", "init_failed": "FATAL engine_dead (generic)",
        "worker_died": "FATAL engine_dead (generic; status: last fatal)",
        "core_died": "FATAL engine_dead (generic; status: last fatal)",
        "api": "api (phase)", "bar_format": "shards (progress)", "shards_desc": "shards (progress)"}


SG_RULE = {"weights_begin": "sg_weights_begin (a rank's 1st: weights, 2nd: drafter)",
           "weights_end": "sg_weights_end (rank 0's: weights_seconds, drafter_weights_seconds)",
           "eagle3": "FATAL eagle3_interface (in kv_cache: the attention backends' set-up)",
           "kv": "sg_kv (rank 0's 1st: kv_cache_tokens/gib, 2nd: drafter_kv_cache_*)", "pool_end": "-",
           "graph_begin": "sg_graphs (phase)", "graph_end_bs": "sg_graphs (rank 0's elapsed: graphs_seconds)",
           "draft_graphs": "sg_graphs (rank 0 only)", "health_generate": "- (/health 503: the watch waits 22 s)",
           "ready": "sg_ready", "sigquit": "FATAL engine_dead (generic)",
           "decode": "sg_spec (log_*: every 40 decode steps)", "bar_format": "shards (progress)",
           "shards_desc": "shards (progress)"}


def sglang(versions):
    print("| line | SGLang file | " + " | ".join(f"{v}: line, text" for v in versions) + " | parser rule |")
    print("|---|---|" + "---|" * len(versions) + "---|")
    srcs = []
    for v in versions:
        s = standin_base.EngineSource("sglang", sglang_standin.MESSAGES, sglang_standin.FALLBACK)
        s.root = str(CACHE / f"sglang-{v}" / "lib" / "python3.11" / "site-packages" / "sglang")
        srcs.append(s)
    for key, (rel, _a) in sglang_standin.MESSAGES.items():
        cells = []
        for s in srcs:
            text, f, line = s.find(key)
            cells.append((f"{f}:{line}: `{text.strip()[:90]!r}`" if line else "- (not found)").replace("|", "\\|"))
        print(f"| {key} | `sglang/{rel}` | " + " | ".join(cells) + f" | {SG_RULE.get(key, '-')} |")


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
    if sys.argv[1:2] == ["--sglang"]:
        sglang(sys.argv[2:] or ["0.5.23"])
    else:
        main(sys.argv[1:] or ["0.16.0", "0.18.0", "0.33.0"])
