"""The ``vllm serve`` command line: built here and nowhere else.

Pure functions.  The vLLM engine (``engines/vllm.py``) calls ``build_serve_argv`` for the plan; the verify stage
runs vLLM's own parser on the result before any restart (roles/verify/files/vllm_verify.py, given this module's
``MANAGED_FLAGS`` by the plan: no hand copy).
"""
from __future__ import annotations

import json
from typing import Any

from deployer.engines.argv import ServeConfigError, check_extra_args, common_fields, num_word

# Flags the deployer owns.  Free-form ``extra_args`` may not set them again (two
# sources of truth for the same flag is how a 25-minute load ends in surprise).
MANAGED_FLAGS = (
    "--served-model-name", "--host", "--port", "--tensor-parallel-size", "-tp",
    "--gpu-memory-utilization", "--max-model-len", "--max-num-seqs", "--trust-remote-code",
    "--speculative-config", "-sc", "--api-key", "--safetensors-load-strategy", "--model-loader-extra-config",
    # a YAML of flags (FlexibleArgumentParser expands it into the argv): it could set any of the above
    "--config", "--model",
)
# vLLM's LoadConfig.safetensors_load_strategy (vllm/config/load.py) and the default loader's only extra keys
# (DefaultModelLoader.__init__: {"enable_multithread_load", "num_threads"},
# vllm/model_executor/model_loader/default_loader.py)
# "prefetch" from vLLM 0.20 (its weight_utils.py: read the shards into the page cache in the background, with
# "Prefetching checkpoint files: N% (k/n)" progress); an older release's own parser refuses it in the verify stage
LOAD_STRATEGIES = ("lazy", "eager", "torchao", "prefetch")
LOADER_EXTRA_KEYS = {"enable_multithread_load": bool, "num_threads": int}

SPEC_METHODS = ("eagle3",)


def speculative_config(method: str, model: str, num_speculative_tokens: int, extra: dict | None = None) -> str:
    """The ``--speculative-config`` JSON: compact, keys sorted, so equal configs render byte-identical."""
    if method not in SPEC_METHODS:
        raise ServeConfigError(f"speculative method: got {method!r}, expected one of {list(SPEC_METHODS)}")
    if not isinstance(num_speculative_tokens, int) or isinstance(num_speculative_tokens, bool) \
            or not 1 <= num_speculative_tokens <= 16:
        raise ServeConfigError(f"num_speculative_tokens: got {num_speculative_tokens!r}, expected an integer 1..16")
    if not model:
        raise ServeConfigError("speculative model (drafter path): empty")
    cfg: dict[str, Any] = dict(extra or {})
    cfg.update({"method": method, "model": model, "num_speculative_tokens": num_speculative_tokens})
    return json.dumps(cfg, sort_keys=True, separators=(",", ":"))


def build_serve_argv(spec: dict) -> list[str]:
    """Validate ``spec`` and return the full argv, launcher first.

    ``spec`` keys: launcher (list), model, served_model_name, host, port,
    tensor_parallel_size, gpu_memory_utilization, max_model_len, max_num_seqs (null: vLLM's default),
    trust_remote_code, speculative ({method, model, num_speculative_tokens, extra}
    or None/{} for no speculation), safetensors_load_strategy ("" = vLLM's default),
    model_loader_extra_config (dict, {} = none), extra_args (list of str).
    """
    launcher, model, port, tp, name = common_fields(spec)
    gmu = spec.get("gpu_memory_utilization")
    if not isinstance(gmu, (int, float)) or isinstance(gmu, bool) or not 0 < float(gmu) <= 1:
        raise ServeConfigError(f"gpu_memory_utilization: got {gmu!r}, expected a number in (0, 1]")
    mml = spec.get("max_model_len")
    if mml is not None and (not isinstance(mml, int) or isinstance(mml, bool) or mml < 1):
        raise ServeConfigError(f"max_model_len: got {mml!r}, expected a positive integer or null")
    seqs = spec.get("max_num_seqs")
    if seqs is not None and (not isinstance(seqs, int) or isinstance(seqs, bool) or seqs < 1):
        raise ServeConfigError(f"max_num_seqs: got {seqs!r}, expected a positive integer or null")
    strategy = spec.get("safetensors_load_strategy") or ""
    if strategy and strategy not in LOAD_STRATEGIES:
        raise ServeConfigError(f"safetensors_load_strategy: got {strategy!r}, expected one of {list(LOAD_STRATEGIES)} "
                               "or empty for vLLM's default")
    loader = spec.get("model_loader_extra_config") or {}
    if not isinstance(loader, dict):
        raise ServeConfigError(f"model_loader_extra_config: got {loader!r}, expected a mapping")
    for k, v in loader.items():
        want = LOADER_EXTRA_KEYS.get(k)
        if want is None or not isinstance(v, want) or (want is int and (isinstance(v, bool) or v < 1)):
            raise ServeConfigError(f"model_loader_extra_config: got {k}={v!r}, expected enable_multithread_load "
                                   "(true/false) and num_threads (a positive integer)")
    extra = check_extra_args(spec.get("extra_args") or [], MANAGED_FLAGS, "extra_args")

    argv = list(launcher) + ["serve", model,
                             "--served-model-name", name,
                             "--host", spec["host"],
                             "--port", str(port),
                             "--tensor-parallel-size", str(tp),
                             "--gpu-memory-utilization", num_word(gmu)]
    if mml is not None:
        argv += ["--max-model-len", str(mml)]
    if seqs is not None:
        argv += ["--max-num-seqs", str(seqs)]
    if spec["trust_remote_code"]:
        argv.append("--trust-remote-code")
    sp = spec.get("speculative") or {}
    if sp:
        argv += ["--speculative-config",
                 speculative_config(sp.get("method", "eagle3"), sp.get("model", ""),
                                    sp.get("num_speculative_tokens"), sp.get("extra"))]
    if strategy:
        argv += ["--safetensors-load-strategy", strategy]
    if loader:
        argv += ["--model-loader-extra-config", json.dumps(loader, sort_keys=True, separators=(",", ":"))]
    argv += list(extra)
    return argv
