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

from deployer.engines.argv import CREDENTIALS_TOKEN, ServeConfigError, check_extra_args, common_fields, switch_flag

# The API key is never on the command line (the process list is world-readable): SGLang has no environment
# variable for it, so it goes in a YAML file SGLang merges with ``--config`` (srt/utils/server_args_config_parser.py),
# handed to the service by systemd's LoadCredential= (the file stays root's 0600).  This word stands for the
# unit's credentials directory; the unit writer turns it into systemd's ``%d`` specifier.
SECRETS_FILE = "sglang-secrets.yaml"

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


_IDENT = re.compile(r"^[a-z0-9_]{1,40}$")


def _name(key, v):
    if v and not _IDENT.match(str(v)):
        raise ServeConfigError(f"sglang_{key}: got {v!r}, expected a name like triton or kimi_k2")
    return v


def _optional_name(key, flag, v):
    """A backend or parser by name; "" leaves SGLang's own."""
    return [flag, v] if _name(key, v) else []


def _kv_cache_dtype(key, flag, v):
    return [flag, _name(key, v) or "auto"]      # always said: "auto" is SGLang's default, written out


def _mem_fraction(key, flag, v):
    v = v or 0
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= float(v) < 1:
        raise ServeConfigError(f"sglang_{key}: got {v!r}, expected a number in (0, 1), or 0 for SGLang's own choice")
    return [flag, repr(float(v))] if v else []


# The launch flags after the speculative block, in argv order: (key, setting, flags, render).  ``key`` is the spec's,
# ``setting`` the deployer_<setting> it comes from (engines/sglang.py passes every row's on), the first flag is the
# one written, the rest its aliases; ``render(key, flag, value)`` gives the words or refuses the value.  A new SGLang
# launch-flag setting is a row here and its default in roles/deployer/defaults/main.yml.
FLAGS = (
    ("attention_backend", "sglang_attention_backend", ("--attention-backend",), _optional_name),
    ("kv_cache_dtype", "sglang_kv_cache_dtype", ("--kv-cache-dtype",), _kv_cache_dtype),
    ("mem_fraction_static", "sglang_mem_fraction_static", ("--mem-fraction-static",), _mem_fraction),
    ("tool_call_parser", "sglang_tool_call_parser", ("--tool-call-parser",), _optional_name),
    ("reasoning_parser", "sglang_reasoning_parser", ("--reasoning-parser",), _optional_name),
    ("language_model_only", "sglang_language_model_only", ("--language-model-only",), switch_flag),
)
# Flags the deployer owns (extra args may not set them again): the model, name, address and parallelism, the
# context length, remote code, the speculative block, the table's, the metrics it reads, the key's YAML (--config:
# it could set any of them), the device.
MANAGED_FLAGS = (("--model-path", "--model", "--served-model-name", "--host", "--port", "--tp-size",
                  "--tensor-parallel-size", "--tp", "--context-length", "--trust-remote-code",
                  "--speculative-algorithm", "--speculative-draft-model-path", "--speculative-num-steps",
                  "--speculative-eagle-topk", "--speculative-num-draft-tokens", "--speculative-draft-attention-backend")
                 + tuple(f for _key, _setting, flags, _render in FLAGS for f in flags)
                 + ("--api-key", "--enable-metrics", "--config", "--device"))


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
    _name("draft_attention_backend", spec.get("draft_attention_backend") or "")
    words = [w for key, _setting, flags, render in FLAGS for w in render(key, flags[0], spec.get(key))]
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
    argv += words
    argv.append("--enable-metrics")
    if spec.get("secrets_file"):
        argv += ["--config", spec["secrets_file"]]
    return argv + list(extra)
