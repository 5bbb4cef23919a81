"""vLLM: the default engine (0.16.0 patched for EAGLE-3 on Kimi-K2.5, 0.18.0+ native).  Its argv is built in
``vllm_argv.py`` (nowhere else); its own checks are ``roles/verify/files/vllm_verify.py``."""
from __future__ import annotations

import json
import re

from deployer import identity
from deployer.engines import vllm_argv
from deployer.engines.argv import common_spec
from deployer.engines.base import Engine, EngineError, argv_value, register
from deployer.engines.sglang_argv import parse_version

_VERSION_RE = re.compile(r"\d+\.\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?")


@register
class VLLM(Engine):
    name, label, package, program = "vllm", "vLLM", "vllm", "vllm"
    version_setting, extra_args_setting = "vllm_version", "extra_args"
    patchable = True
    verifier = "vllm_verify.py"
    log_rules = metrics_rules = "vllm"
    drafts_metric = "vllm:spec_decode_num_drafts_total"
    memory_plan = True
    canary_probes = ("vllm_marlin_repack", "vllm_moe_topk", "vllm_marlin_moe", "vllm_fa2")
    api_key_env = "VLLM_API_KEY"
    # vLLM's AuthenticationMiddleware checks the key on /v1 only (vllm/entrypoints/openai/server_utils.py); its
    # --middleware loads the guard around every route (engines/vllm_argv.py api_guard_words)
    api_guard = True
    keyed_paths = "/v1"
    unguarded_open = "every path outside /v1 (/invocations, /tokenize, /pause, ...)"
    managed_flags, positional_dests = vllm_argv.MANAGED_FLAGS, ("model_tag",)
    cuda_libraries = {
        "vllm/_moe_C*.so": "fused MoE, Kimi's INT4 Marlin MoE among them",
        "vllm/_C*.so": "core kernels, gptq_marlin_repack of Kimi's INT4 experts among them",
        "vllm/vllm_flash_attn/_vllm_fa2_C*.so": "FlashAttention 2: MLA prefill and the drafter's attention off sm_100",
    }

    def version(self, s):
        version = str(s.get("vllm_version") or "")
        if not _VERSION_RE.fullmatch(version):
            raise EngineError(f"vllm_version: got {version!r}, expected a release like 0.16.0 (digits and dots; "
                              "it names the venv's directory)")
        return version

    def venv(self, s, root, version):
        patched = bool(s["patch_enabled"])
        return f"{root}/venvs/vllm-{version}" + (f"-p{s.get('patch_engine_id') or identity.patch_engine_id()}"
                                                 if patched else ""), patched

    def argv(self, s, venv, drafter, credentials):
        # every row of vllm_argv.FLAGS from its setting (a new flag needs no line here), the drafter from the plan
        return vllm_argv.build_serve_argv({
            **common_spec(s, venv, self.program),
            **{key: s.get(key) for key, _flags, _render in vllm_argv.FLAGS if key in s},
            "speculative": ({"method": "eagle3", "model": drafter["dir"],
                             "num_speculative_tokens": s["num_speculative_tokens"],
                             "extra": s.get("speculative_extra") or {},
                             "max_batch_size": s.get("speculation_max_batch_size") or 0} if drafter else {}),
            "api_guard": identity.api_guard_module(f"{s['root'].rstrip('/')}/bin")[1],
            "extra_args": s.get("extra_args") or [],
        })

    def guarded(self, argv):
        mw = argv_value(argv, "--middleware") or ""
        return mw.startswith("deployer_api_guard_") and mw.endswith("." + vllm_argv.API_GUARD_CLASS)

    def speculative_of(self, argv):
        raw = argv_value(argv, "--speculative-config", "-sc")
        if raw is None:
            return False, 0
        try:
            cfg = json.loads(raw)
        except ValueError:
            return True, 0
        return True, int(cfg.get("num_speculative_tokens") or 0) if isinstance(cfg, dict) else 0

    def env(self, s, server_cache):
        # PYTHONPATH: root's bin/, where the API guard's module lives (vLLM imports --middleware by name)
        return {"VLLM_ENGINE_READY_TIMEOUT_S": str(int(s["engine_ready_timeout_seconds"])),
                "VLLM_CACHE_ROOT": f"{server_cache}/vllm", "PYTHONPATH": f"{s['root'].rstrip('/')}/bin"}

    # Where a release reads the drafter's aux layer ids and how it sizes the drafter's fc, measured on each release's
    # own source (bench/compat_matrix.py, docs/compatibility.md): up to 0.20, gpu_model_runner.py reads only a
    # top-level eagle_aux_hidden_state_layer_ids and llama_eagle3.py builds fc for 3 x hidden; from 0.22, the runner
    # falls back to eagle_config's ids and the drafter sizes fc by their count.
    NESTED_IDS_FROM = (0, 22)

    @staticmethod
    def _at_least(version, minor):
        """Whether ``version`` (a release like 0.30.1; "" unknown: False) is ``minor`` (0, 30) or later."""
        v = parse_version(version) if version else None
        return bool(v) and v[:2] >= minor

    def _reads_nested(self, version):
        return self._at_least(version, self.NESTED_IDS_FROM)

    def aux_layers(self, drafter_cfg, num_layers, version=""):
        top = drafter_cfg.get("eagle_aux_hidden_state_layer_ids")
        nested = (drafter_cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        if top:
            return [int(i) for i in top], "eagle_aux_hidden_state_layer_ids"
        if nested and self._reads_nested(version):
            return [int(i) for i in nested], "eagle_config.eagle_aux_hidden_state_layer_ids"
        if self._reads_nested(version):
            return [2, num_layers // 2, num_layers - 3], "the target's default (2, L//2, L-3): no ids in the config"
        return [2, num_layers // 2, num_layers - 3], (
            "the target's default (2, L//2, L-3): vLLM < 0.22 reads only a top-level "
            "eagle_aux_hidden_state_layer_ids" + (", the one in eagle_config is ignored" if nested else ""))

    # What the EAGLE proposer reads from a multimodal target's config when it loads the drafter, after the target's
    # weights, by architecture: 0.16/0.17 through the deployer's P5, 0.18-0.33 natively (v1/spec_decode/eagle.py,
    # llm_base_proposer.py from 0.32: `target_model.config.media_placeholder_token_id` for KimiK25); 0.34's Model
    # Runner V2 reads none (module_utils/eagle3_patch.py).  The hub's Kimi-K2.5 config has the field; one re-saved
    # in transformers 5.x's schema names it image_token_id only, and the drafter then dies at load (measured on
    # vLLM 0.32 on a CPU: AttributeError ... 'media_placeholder_token_id').  tests/vllm checks each release's source.
    PROPOSER_TARGET_FIELDS = {"KimiK25ForConditionalGeneration": ("media_placeholder_token_id",)}
    PROPOSER_READS_BEFORE = (0, 34)

    # From 0.30 llama_eagle3.py builds draft_id_to_target_id only when draft_vocab_size differs from the target's
    # vocabulary, and a checkpoint that ships d2t anyway fails the drafter's load ("There is no module or parameter
    # named 'draft_id_to_target_id' in Eagle3LlamaForCausalLM": vLLM 0.32 on a CPU, issue 41).  0.29.0's source has no
    # such branch, 0.30.0's has (the wheels, read 2026-12-05); tests/vllm checks 0.18 and 0.33.
    D2T_FULL_VOCAB_REFUSED_FROM = (0, 30)

    def loads_d2t_at_full_vocab(self, version=""):
        return not self._at_least(version, self.D2T_FULL_VOCAB_REFUSED_FROM)

    def proposer_reads(self, target_cfg, version=""):
        if self._at_least(version, self.PROPOSER_READS_BEFORE):
            return []
        return [f for a in target_cfg.get("architectures") or [] for f in self.PROPOSER_TARGET_FIELDS.get(a, ())]

    def exported_elsewhere(self, drafter_cfg, version=""):
        if self._reads_nested(version):
            return None
        return (drafter_cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")

    def built_fc_inputs(self, drafter_cfg, version=""):
        hidden = int(drafter_cfg.get("target_hidden_size") or drafter_cfg.get("hidden_size") or 0)
        if self._reads_nested(version):
            nested = (drafter_cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
            return (len(nested) if nested else 3) * hidden
        return 3 * hidden     # llama_eagle3.py: fc_input_size = (target_hidden_size or hidden_size) * 3
