"""The ``vllm serve`` command line: built here and nowhere else.

Pure functions.  The vLLM engine (``engines/vllm.py``) calls ``build_serve_argv`` for the plan; the verify stage
runs vLLM's own parser on the result before any restart (roles/verify/files/vllm_verify.py, given this module's
``MANAGED_FLAGS`` by the plan: no hand copy).
"""
from __future__ import annotations

import json
import re
from typing import Any

from deployer.engines.argv import ServeConfigError, check_extra_args, common_fields, num_word, switch_flag

# vLLM's LoadConfig.safetensors_load_strategy (vllm/config/load.py) and the default loader's only extra keys
# (DefaultModelLoader.__init__: {"enable_multithread_load", "num_threads"},
# vllm/model_executor/model_loader/default_loader.py)
# "prefetch" from vLLM 0.20 (its weight_utils.py: read the shards into the page cache in the background, with
# "Prefetching checkpoint files: N% (k/n)" progress); an older release's own parser refuses it in the verify stage
LOAD_STRATEGIES = ("lazy", "eager", "torchao", "prefetch")
LOADER_EXTRA_KEYS = {"enable_multithread_load": bool, "num_threads": int}

SPEC_METHODS = ("eagle3",)


SCHEDULE_KEY = "num_speculative_tokens_per_batch_size"


def speculative_config(method: str, model: str, num_speculative_tokens: int, extra: dict | None = None,
                       max_batch_size: int = 0) -> str:
    """The ``--speculative-config`` JSON: compact, keys sorted, so equal configs render byte-identical.
    ``max_batch_size`` (N > 0): speculate only while at most N sequences run in a step - vLLM's per-batch-size
    schedule ``[[1, N, k], [N + 1, N + 1, 0]]`` (v1/spec_decode/dynamic/utils.py: the last range's k carries on to
    max_num_seqs); a release without it refuses the key in its own config check (extra fields forbidden)."""
    if method not in SPEC_METHODS:
        raise ServeConfigError(f"speculative method: got {method!r}, expected one of {list(SPEC_METHODS)}")
    if not isinstance(num_speculative_tokens, int) or isinstance(num_speculative_tokens, bool) \
            or not 1 <= num_speculative_tokens <= 16:
        raise ServeConfigError(f"num_speculative_tokens: got {num_speculative_tokens!r}, expected an integer 1..16")
    if not model:
        raise ServeConfigError("speculative model (drafter path): empty")
    if not isinstance(max_batch_size, int) or isinstance(max_batch_size, bool) or max_batch_size < 0:
        raise ServeConfigError(f"speculation_max_batch_size: got {max_batch_size!r}, expected a count of sequences "
                               "(0: speculate at every batch size)")
    cfg: dict[str, Any] = dict(extra or {})
    if max_batch_size:
        if SCHEDULE_KEY in cfg:
            raise ServeConfigError(f"speculative_extra sets {SCHEDULE_KEY} and speculation_max_batch_size sets it "
                                   "too: keep one")
        cfg[SCHEDULE_KEY] = [[1, max_batch_size, num_speculative_tokens], [max_batch_size + 1, max_batch_size + 1, 0]]
    cfg.update({"method": method, "model": model, "num_speculative_tokens": num_speculative_tokens})
    return json.dumps(cfg, sort_keys=True, separators=(",", ":"))


def _fraction(key, flag, v):
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < float(v) <= 1:
        raise ServeConfigError(f"{key}: got {v!r}, expected a number in (0, 1]")
    return [flag, num_word(v)]


def _count(key, flag, v):
    """A positive count; null or 0 leaves vLLM's own (the settings' word for it)."""
    if v is None or (v == 0 and not isinstance(v, bool)):
        return []
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ServeConfigError(f"{key}: got {v!r}, expected a positive integer or null")
    return [flag, str(v)]


def _speculative(key, flag, sp):
    if not sp:
        return []
    return [flag, speculative_config(sp.get("method", "eagle3"), sp.get("model", ""),
                                     sp.get("num_speculative_tokens"), sp.get("extra"), sp.get("max_batch_size") or 0)]


def _load_strategy(key, flag, v):
    if v and v not in LOAD_STRATEGIES:
        raise ServeConfigError(f"{key}: got {v!r}, expected one of {list(LOAD_STRATEGIES)} or empty for vLLM's "
                               "default")
    return [flag, v] if v else []


def _loader_extra(key, flag, loader):
    loader = loader or {}
    if not isinstance(loader, dict):
        raise ServeConfigError(f"{key}: got {loader!r}, expected a mapping")
    for k, v in loader.items():
        want = LOADER_EXTRA_KEYS.get(k)
        if want is None or not isinstance(v, want) or (want is int and (isinstance(v, bool) or v < 1)):
            raise ServeConfigError(f"{key}: got {k}={v!r}, expected enable_multithread_load (true/false) and "
                                   "num_threads (a positive integer)")
    return [flag, json.dumps(loader, sort_keys=True, separators=(",", ":"))] if loader else []


# The launch flags after the ones every engine takes (common_fields), in argv order: (key, flags, render).  ``key``
# is the spec's and the setting's name (deployer_<key>; "speculative" is the plan's drafter, not a setting), the
# first flag is the one written, the rest its aliases; ``render(key, flag, value)`` gives the words ([] leaves
# vLLM's default) or refuses the value with the measured and the expected.  A new vLLM launch-flag setting is a row
# here and its default in roles/deployer/defaults/main.yml: engines/vllm.py passes every row's setting on.
FLAGS = (
    ("gpu_memory_utilization", ("--gpu-memory-utilization",), _fraction),
    ("max_model_len", ("--max-model-len",), _count),
    ("max_num_seqs", ("--max-num-seqs",), _count),
    ("trust_remote_code", ("--trust-remote-code",), switch_flag),
    ("speculative", ("--speculative-config", "-sc"), _speculative),
    ("safetensors_load_strategy", ("--safetensors-load-strategy",), _load_strategy),
    ("model_loader_extra_config", ("--model-loader-extra-config",), _loader_extra),
)


def api_guard_words(module: str | None) -> list[str]:
    """``--middleware <module>.ApiGuard``: the deployer's API guard (roles/render/files/api_guard.py), loaded by vLLM's
    own ``build_app`` around every route (vLLM checks its key on /v1 only).  Managed: an operator's second
    ``--middleware`` word is refused, so the list vLLM builds is the deployer's alone."""
    if not module:
        return []
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", module):
        raise ServeConfigError(f"api guard module: got {module!r}, expected a Python module name")
    return ["--middleware", f"{module}.{API_GUARD_CLASS}"]


API_GUARD_CLASS = "ApiGuard"

# Flags the deployer owns.  Free-form ``extra_args`` may not set them again (two sources of truth for the same flag
# is how a 25-minute load ends in surprise): common_fields' own, the table's, the key (env file only), and a YAML of
# flags (--config: FlexibleArgumentParser expands it into the argv, so it could set any of them) or --model.
MANAGED_FLAGS = (("--served-model-name", "--host", "--port", "--tensor-parallel-size", "-tp")
                 + tuple(f for _key, flags, _render in FLAGS for f in flags)
                 + ("--api-key", "--config", "--model", "--middleware"))


def build_serve_argv(spec: dict) -> list[str]:
    """Validate ``spec`` and return the full argv, launcher first.

    ``spec`` keys: launcher (list), model, served_model_name, host, port, tensor_parallel_size, every ``FLAGS``
    key (speculative: {method, model, num_speculative_tokens, extra} or None/{} for no speculation), api_guard
    (the guard's module name, or None), extra_args (list of str).
    """
    launcher, model, port, tp, name = common_fields(spec)
    words = [w for key, flags, render in FLAGS for w in render(key, flags[0], spec.get(key))]
    words += api_guard_words(spec.get("api_guard"))
    extra = check_extra_args(spec.get("extra_args") or [], MANAGED_FLAGS, "extra_args")
    return (list(launcher) + ["serve", model, "--served-model-name", name, "--host", spec["host"], "--port", str(port),
                              "--tensor-parallel-size", str(tp)] + words + list(extra))
