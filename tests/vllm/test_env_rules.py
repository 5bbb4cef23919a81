"""The unit's environment held to each release's own table of variables (vllm/envs.py, read from the wheels): the
verify stage refuses, before the restart, a variable the release removed (0.34.0 makes a set VLLM_MARLIN_INPUT_DTYPE
a start failure) or reads no such variable of (0.34.0 has no VLLM_USE_V2_MODEL_RUNNER), where older releases take
both (roles/verify/files/vllm_verify.py env_problems; issue 55)."""
import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("vllm_verify", ROOT / "roles/verify/files/vllm_verify.py")
vllm_verify = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vllm_verify)

# what a deploy's unit sets (deployer/engines/vllm.py, the CPU build's and the operator's env_extra)
OURS = ["VLLM_API_KEY", "VLLM_CACHE_ROOT", "VLLM_ENGINE_READY_TIMEOUT_S", "NCCL_P2P_DISABLE"]


def tables(root: Path):
    """(known names, {removed name: vLLM's hint}) as the release's envs.py defines them."""
    known, removed = set(), {}
    for node in ast.parse((root / "envs.py").read_text()).body:
        target = getattr(node, "target", None) or (node.targets[0] if getattr(node, "targets", None) else None)
        name = getattr(target, "id", "")
        if name == "environment_variables" and isinstance(node.value, ast.Dict):
            known = {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
        elif name == "removed_environment_variables":
            removed = ast.literal_eval(node.value)
    return known, removed


@pytest.mark.parametrize("version", ["0.16.0", "0.33.0"])
def test_older_releases_take_what_the_deployer_sets_and_both_variables(vllm_src, version):
    known, removed = tables(vllm_src(version))
    assert removed == {} and len(known) > 200
    assert vllm_verify.env_problems(OURS + ["VLLM_MARLIN_INPUT_DTYPE", "VLLM_USE_V2_MODEL_RUNNER"], known,
                                    removed) == []


def test_0_34_refuses_the_removed_and_the_gone_with_its_own_words(vllm_src):
    known, removed = tables(vllm_src("0.34.0"))
    assert vllm_verify.env_problems(OURS, known, removed) == []
    got = vllm_verify.env_problems(OURS + ["VLLM_MARLIN_INPUT_DTYPE", "VLLM_USE_V2_MODEL_RUNNER", "VLLM_TYPO_X"],
                                   known, removed)
    assert got == [
        "VLLM_MARLIN_INPUT_DTYPE: this release removed it and refuses to start with it set (Marlin no longer "
        "supports 8-bit activations. Use `--quantization humming` and set the activation dtype with "
        "VLLM_HUMMING_INPUT_QUANT_CONFIG, e.g. '{\"dtype\":\"int8\"}'.)",
        "VLLM_TYPO_X: this release reads no such variable (a typo, or one it no longer has)",
        "VLLM_USE_V2_MODEL_RUNNER: this release reads no such variable (a typo, or one it no longer has)"]
