"""The ``sglang serve`` command line: built here and nowhere else (the SGLang engine's twin of vllm_argv.py).

Pure functions.  The SGLang engine (``engines/sglang.py``) calls ``build_sglang_argv`` for the plan.  Flag names
are SGLang's (``ServerArgs.add_cli_args``, sglang/srt/server_args.py and srt/arg_groups/fields/); the verify stage
runs SGLang's own parser and server-args resolution on the result before any restart (roles/verify).

Two things SGLang cannot check GPU-less, and the deployer therefore encodes itself (docs/backends.md):
  * attention backends that do not run on sm_120 (RTX PRO 6000 Blackwell): ``sm120_refusals``;
  * the SGLang releases that lack the Kimi-K2.5 class or its EAGLE-3 hook: ``version_refusal`` (the version pin)
    and, on the installed source, the patch stage's capability probe (roles/patch, the ``sglang_capability``
    module over ``module_utils/sglang_source.py``).
"""
from __future__ import annotations

import re

from deployer.engines.argv import CREDENTIALS_TOKEN, ServeConfigError, check_extra_args, common_fields

# The API key is never on the command line (the process list is world-readable): SGLang has no environment
# variable for it, so it goes in a YAML file SGLang merges with ``--config`` (srt/utils/server_args_config_parser.py),
# handed to the service by systemd's LoadCredential= (the file stays root's 0600).  This word stands for the
# unit's credentials directory; the unit writer turns it into systemd's ``%d`` specifier.
SECRETS_FILE = "sglang-secrets.yaml"

MANAGED_FLAGS = (
    "--model-path", "--model", "--served-model-name", "--host", "--port", "--tp-size", "--tensor-parallel-size",
    "--tp", "--trust-remote-code", "--speculative-algorithm", "--speculative-draft-model-path",
    "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens",
    "--attention-backend", "--speculative-draft-attention-backend", "--kv-cache-dtype", "--mem-fraction-static",
    "--context-length", "--tool-call-parser", "--reasoning-parser", "--api-key", "--enable-metrics", "--config",
    "--language-model-only", "--device",
)
# sm_120 (RTX PRO 6000 Blackwell): MLA attention runs on triton; these do not (trtllm_mla: prefill crashes with
# "Unsupported architecture" though SGLang's own check lets SM12x through; cutedsl_mla: SM100 only; fa3, flashmla:
# no sm_120 kernels).  SGLang's checks see "no GPU" when run GPU-less, so they cannot catch this before the load.
SM120_REFUSED = {
    "trtllm_mla": "prefill crashes with 'Unsupported architecture' on sm_120 (SGLang's own check lets SM12x through)",
    "cutedsl_mla": "SM100 only",
    "fa3": "no sm_120 kernels (Hopper only)",
    "flashmla": "no sm_120 kernels (FlashMLA/DeepGEMM do not support sm_120)",
}
# Releases (PyPI) and what they can serve here.  Kimi-K2.5's class appears in 0.5.9, its EAGLE-3 hook
# (set_eagle3_layers_to_capture) in 0.5.10, the MLA drafter class (Eagle3DeepseekV2ForCausalLM) in 0.5.12.
MIN_KIMI = (0, 5, 9)
MIN_EAGLE3 = (0, 5, 10)
MIN_MLA_DRAFTER = (0, 5, 12)
MIN_LANGUAGE_MODEL_ONLY = (0, 5, 18)


def parse_version(v: str) -> tuple[int, ...] | None:
    m = re.match(r"^(\d+)\.(\d+)\.(\d+)(?:\.post\d+|rc\d+)?$", str(v))
    return tuple(int(x) for x in m.groups()) if m else None


def version_refusal(version: str, speculative: bool, drafter_arch: str = "", language_model_only: bool = False) -> str:
    """Why this SGLang release cannot serve Kimi-K2.5 here ("" when it can, as far as the version tells)."""
    v = parse_version(version)
    if v is None:
        return f"sglang_version: got {version!r}, expected a release like 0.5.23"
    if v < MIN_KIMI:
        return (f"SGLang {version} has no Kimi-K2.5 model class (KimiK25ForConditionalGeneration, from 0.5.9); "
                "expected >= 0.5.10 (>= 0.5.12 for the MLA drafter)")
    if speculative and v < MIN_EAGLE3:
        return (f"SGLang {version}: KimiK25ForConditionalGeneration lacks set_eagle3_layers_to_capture (EAGLE-3, "
                "from 0.5.10); SGLang would fail only after the weight load")
    if speculative and drafter_arch == "Eagle3DeepseekV2ForCausalLM" and v < MIN_MLA_DRAFTER:
        return (f"SGLang {version} has no Eagle3DeepseekV2ForCausalLM (the MLA drafter's class, from 0.5.12); "
                "expected >= 0.5.12")
    if language_model_only and v < MIN_LANGUAGE_MODEL_ONLY:
        return f"sglang_language_model_only: SGLang {version} has no --language-model-only (from 0.5.18)"
    return ""


def sm120_refusals(argv: list[str], compute_caps: list[str]) -> list[str]:
    """The attention backends in ``argv`` that cannot run on the host's GPUs (compute capability 12.x)."""
    if not any(str(c).split(".")[0] == "12" for c in compute_caps):
        return []
    out = []
    for flag in ("--attention-backend", "--speculative-draft-attention-backend", "--prefill-attention-backend",
                 "--decode-attention-backend"):
        for i, a in enumerate(argv):
            value = argv[i + 1] if a == flag and i + 1 < len(argv) else (a.split("=", 1)[1] if a.startswith(flag + "=")
                                                                          else None)
            if value in SM120_REFUSED:
                out.append(f"{flag} {value}: {SM120_REFUSED[value]}; on sm_120 use triton")
    return out


def _pos_int(spec: dict, key: str, lo: int = 1, hi: int = 1 << 30) -> int:
    v = spec.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ServeConfigError(f"{key}: got {v!r}, expected an integer {lo}..{hi}")
    return v


def build_sglang_argv(spec: dict) -> list[str]:
    """Validate ``spec`` and return the full argv, launcher first.

    ``spec`` keys: launcher (list), model, served_model_name, host, port, tensor_parallel_size, context_length
    (None = the model's), trust_remote_code, speculative ({model, num_steps, eagle_topk, num_draft_tokens} or {}),
    attention_backend, draft_attention_backend, kv_cache_dtype, mem_fraction_static (0 = SGLang decides),
    tool_call_parser, reasoning_parser ("" = none), language_model_only, secrets_file (a path or "" when there
    is no API key), extra_args.
    """
    launcher, model, port, tp, name = common_fields(spec)
    ctx = spec.get("context_length")
    if ctx is not None:
        _pos_int(spec, "context_length")
    ident = re.compile(r"^[a-z0-9_]{1,40}$")
    for key in ("attention_backend", "draft_attention_backend", "kv_cache_dtype", "tool_call_parser",
                "reasoning_parser"):
        v = spec.get(key) or ""
        if v and not ident.match(str(v)):
            raise ServeConfigError(f"sglang_{key}: got {v!r}, expected a name like triton or kimi_k2")
    mfs = spec.get("mem_fraction_static") or 0
    if not isinstance(mfs, (int, float)) or isinstance(mfs, bool) or not 0 <= float(mfs) < 1:
        raise ServeConfigError(f"sglang_mem_fraction_static: got {mfs!r}, expected a number in (0, 1), or 0 for "
                               "SGLang's own choice")
    extra = check_extra_args(spec.get("extra_args") or [], MANAGED_FLAGS, "sglang_extra_args", (CREDENTIALS_TOKEN,),
                             "the secret file")

    argv = launcher + ["serve", "--model-path", model, "--served-model-name", name,
                             "--host", spec["host"], "--port", str(port), "--tp-size", str(tp)]
    if ctx is not None:
        argv += ["--context-length", str(ctx)]
    if spec["trust_remote_code"]:
        argv.append("--trust-remote-code")
    sp = spec.get("speculative") or {}
    if sp:
        if not sp.get("model"):
            raise ServeConfigError("speculative model (drafter path): empty")
        steps = _pos_int({"num_speculative_tokens": sp.get("num_steps")}, "num_speculative_tokens", 1, 16)
        topk = _pos_int({"sglang_eagle_topk": sp.get("eagle_topk", 1)}, "sglang_eagle_topk", 1, 16)
        drafts = sp.get("num_draft_tokens") or steps + 1
        _pos_int({"sglang_num_draft_tokens": drafts}, "sglang_num_draft_tokens", 2, 256)
        if topk == 1 and drafts != steps + 1:
            raise ServeConfigError(f"sglang_num_draft_tokens: got {drafts} with eagle_topk 1, expected "
                                   f"num_speculative_tokens + 1 = {steps + 1} (a chain of {steps} drafts)")
        argv += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", sp["model"],
                 "--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk),
                 "--speculative-num-draft-tokens", str(drafts)]
        if spec.get("draft_attention_backend"):
            # the drafter inherits the target's backend unless told (SGLang #23490): say it explicitly
            argv += ["--speculative-draft-attention-backend", spec["draft_attention_backend"]]
    if spec.get("attention_backend"):
        argv += ["--attention-backend", spec["attention_backend"]]
    argv += ["--kv-cache-dtype", spec.get("kv_cache_dtype") or "auto"]
    if mfs:
        argv += ["--mem-fraction-static", repr(float(mfs))]
    for flag, key in (("--tool-call-parser", "tool_call_parser"), ("--reasoning-parser", "reasoning_parser")):
        if spec.get(key):
            argv += [flag, spec[key]]
    if spec.get("language_model_only"):
        argv.append("--language-model-only")
    argv.append("--enable-metrics")
    if spec.get("secrets_file"):
        argv += ["--config", spec["secrets_file"]]
    return argv + list(extra)
