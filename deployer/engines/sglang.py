"""SGLang (``deployer_backend: sglang``): never patched; its installed source is checked instead.  Its argv is
built in ``sglang_argv.py`` (nowhere else); its own checks are ``roles/verify/files/sglang_verify.py``."""
from __future__ import annotations

import json

from deployer.engines import sglang_argv
from deployer.engines.argv import CREDENTIALS_TOKEN, common_spec
from deployer.engines.base import Engine, EngineError, argv_value, register


@register
class SGLang(Engine):
    name, label, package, program = "sglang", "SGLang", "sglang", "sglang"
    version_setting, extra_args_setting = "sglang_version", "sglang_extra_args"
    capability_probe = True
    verifier = "sglang_verify.py"
    log_rules = metrics_rules = "sglang"
    drafts_metric = "sglang:spec_verify_calls_total"
    canary_probes = ("sglang_flashinfer_sampling",)
    cuda_libraries = {"sgl_kernel/*.so": "sgl-kernel", "sgl_kernel/*/*.so": "sgl-kernel, per-architecture builds"}
    unit_marker = "--model-path"
    # SGLang's own key check (srt/utils/auth.py decide_request_auth, 0.5.23) asks the key everywhere but
    # /health*, /ready*, /metrics*; its admin routes take the same key when no admin key is set (docs/security.md)
    keyed_paths = "every path (its admin routes too)"
    unguarded_open = "/health*, /ready*, /metrics* (SGLang's own check)"
    managed_flags = sglang_argv.MANAGED_FLAGS
    # once started, SGLang's /health runs a one-token generation and answers when the scheduler does: after at
    # least 1 s, at most SGLANG_HEALTH_CHECK_TIMEOUT (20 s) later with 503 (srt/entrypoints/http_server.py)
    health_timeout_seconds = 22.0

    def version(self, s):
        version = str(s.get("sglang_version") or "")
        if not sglang_argv.parse_version(version):
            raise EngineError(f"sglang_version: got {version!r}, expected a release like 0.5.23")
        return version

    def credentials(self, s):
        # SGLang has no environment variable for its API key and argv is world-readable: a YAML merged with --config
        return {sglang_argv.SECRETS_FILE: sglang_argv.SECRETS_FILE} if s.get("api_key") else {}

    def secret_files(self, api_key):
        head = "# Managed by deployer.  Mode 0600: SGLang's API key (merged with --config).\n"
        return {sglang_argv.SECRETS_FILE: head + (f"api-key: {json.dumps(api_key)}\n" if api_key else "{}\n")}

    def argv(self, s, venv, drafter, credentials):
        return sglang_argv.build_sglang_argv({
            **common_spec(s, venv, self.program),
            "context_length": s.get("max_model_len") or None,
            "trust_remote_code": bool(s["trust_remote_code"]),
            "speculative": ({"model": drafter["dir"], "num_steps": s["num_speculative_tokens"],
                             "eagle_topk": s["sglang_eagle_topk"],
                             "num_draft_tokens": s.get("sglang_num_draft_tokens") or 0} if drafter else {}),
            # every row of sglang_argv.FLAGS from its setting (a new flag needs no line here)
            **{key: s.get(setting) for key, setting, _flags, _render in sglang_argv.FLAGS if setting in s},
            "draft_attention_backend": s["sglang_draft_attention_backend"],
            "secrets_file": (f"{CREDENTIALS_TOKEN}/{sglang_argv.SECRETS_FILE}" if credentials else ""),
            "extra_args": s.get("sglang_extra_args") or [],
        })

    def draft_tokens_per_step(self, s):
        # SGLang verifies speculative_num_draft_tokens per step, the first of them the last accepted token
        # (tokenizer_manager.py: proposed = verify steps x (num_draft_tokens - 1)); sglang_argv's default
        return int(s.get("sglang_num_draft_tokens") or int(s["num_speculative_tokens"]) + 1) - 1

    def speculative_of(self, argv):
        if argv_value(argv, "--speculative-algorithm") is None:
            return False, 0
        drafts = argv_value(argv, "--speculative-num-draft-tokens")
        if drafts is None:      # SGLang's own default: one more than the steps
            drafts = str(int(argv_value(argv, "--speculative-num-steps") or 0) + 1)
        return True, max(0, int(drafts) - 1) if drafts.isdigit() else 0

    # FlashInfer JIT-compiles its kernels on first use: CUDA_HOME's nvcc, `ninja` and `c++` run by name
    # (flashinfer/jit/cpp_ext.py, 0.7.2); the ninja wheel puts ninja in the venv's bin
    jit_toolchain = ("nvcc", "ninja", "c++", "curand")

    def env(self, s, server_cache):
        # FlashInfer's JIT and kernel caches (flashinfer-cubin pre-staged by the install stage: nothing is
        # downloaded at run time) and torch's compile cache, in the shared server cache
        return {"FLASHINFER_WORKSPACE_BASE": f"{server_cache}/flashinfer",
                "TORCHINDUCTOR_CACHE_DIR": f"{server_cache}/inductor"}

    def refusal(self, version, speculative, drafter, s):
        if speculative and s.get("speculation_max_batch_size"):
            return ("speculation_max_batch_size: SGLang has no per-batch-size speculation schedule (vLLM's "
                    "num_speculative_tokens_per_batch_size); set it to 0 to serve with SGLang")
        return sglang_argv.version_refusal(version, speculative, str((drafter or {}).get("architecture") or ""),
                                            bool(s.get("sglang_language_model_only")))

    def sm120_refusals(self, argv, compute_caps):
        return sglang_argv.sm120_refusals(argv, compute_caps)

    def aux_layers(self, drafter_cfg, num_layers, version=""):
        # spec_aux_hidden_state.py (0.5.23): eagle_config["eagle_aux_hidden_state_layer_ids"], nested only;
        # deepseek_v2.set_eagle3_layers_to_capture: ids starting at 1 are shifted by +1; none: [2, L // 2, L - 3]
        nested = (drafter_cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        if nested:
            ids = [int(i) for i in nested]
            if ids and ids[0] == 1:
                return [i + 1 for i in ids], "eagle_config.eagle_aux_hidden_state_layer_ids (+1: they start at 1)"
            return ids, "eagle_config.eagle_aux_hidden_state_layer_ids"
        return [2, num_layers // 2, num_layers - 3], \
            "the target's default (2, L//2, L-3): SGLang reads only eagle_config's ids"

    def exported_elsewhere(self, drafter_cfg, version=""):
        return drafter_cfg.get("eagle_aux_hidden_state_layer_ids")


