# -*- coding: utf-8 -*-
"""The load phases as each engine logs them: the patterns (``RX``) and, per engine, the ordered rules that move a
``LoadState`` (engine_logs.py) from phase to phase and read its facts on the way.  Each rule's source line in vLLM is
listed in docs/standin-fidelity.md, SGLang's in docs/backends.md.  Standard library only."""
from __future__ import annotations

import re

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
    # eager (--enforce-eager): nothing is compiled; the profile run that sizes the KV cache follows
    st._enter("kv_cache" if st.eager else "compile", t)


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
    # engine captures none (its engine init ends the KV phase), nor does an eager one
    if st.facts.get("kv_cache_device") != "CPU" and not st.eager:
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
