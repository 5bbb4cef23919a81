"""The GPU code in the engine wheels the deployer installs (the prepared venvs), read as the verify stage reads it on a
host: vLLM 0.16/0.18's Kimi kernels carry only PTX 8.8 for sm_120 (driver >= 575.51.03), 0.33 needs CUDA 13's 580;
the numbers of the scan in issue 42's review."""
import glob

import pytest

from deployer import driver_floor as df
from deployer.engines import get
from deployer.host.module_utils import fatbin
from helpers import CACHE, ROOT, need

pytestmark = pytest.mark.vllm


def read(venv, engine="vllm"):
    v = CACHE / "venvs" / venv
    need((v / ".deployer-installed").exists(), f"prepared {venv} venv missing (scripts/dev.sh prepares it)")
    site = glob.glob(str(v / "lib/python3*/site-packages"))[0]
    libs = []
    for pattern, label in get(engine).cuda_libraries.items():
        for path in sorted(glob.glob(f"{site}/{pattern}")):
            libs.append(dict(fatbin.for_gpu(fatbin.units(path), 12, 0), file=path[len(site) + 1:], label=label,
                             compute_cap="12.0", pattern=pattern, error=None))
    torch_cuda = open(f"{site}/torch/version.py").read().split("cuda: Optional[str] = '")[1].split("'")[0]
    return {lib["file"]: lib for lib in libs}, torch_cuda


@pytest.mark.parametrize("venv", ["vllm-0.16.0", "vllm-0.18.0"])
def test_vllm_016_018_marlin_moe_is_ptx_only_on_sm120(venv):
    libs, torch_cuda = read(venv)
    moe = libs["vllm/_moe_C.abi3.so"]
    assert moe["ptx_only"] == 15 and moe["ptx_isa"] == "8.8", moe
    assert libs["vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"]["sass"] == 0
    floor = df.floor(list(libs.values()), torch_cuda)
    assert torch_cuda == "12.8" and floor["driver"] == "575.51.03"
    assert "15 of" in df.refusal(floor, "570.133.20")


def test_vllm_033_carries_sm120_marlin_and_needs_cuda13():
    libs, torch_cuda = read("vllm-0.33.0")
    assert libs["vllm/_moe_C_stable_libtorch.abi3.so"]["sass"] == 27
    assert torch_cuda == "13.0" and df.floor(list(libs.values()), torch_cuda)["driver"] == "580.65.06"


def test_sglang_0523_kernels_have_sm120_code_and_need_cuda13():
    libs, torch_cuda = read("sglang-0.5.23", "sglang")
    assert all(not lib["ptx_only"] for lib in libs.values()), libs
    assert df.floor(list(libs.values()), torch_cuda)["driver"] == "580.65.06"


def _release_ops(venv, module="vllm/_custom_ops.py",
                 names=("gptq_marlin_repack", "topk_softmax", "moe_wna16_marlin_gemm"), out=None):
    """The prepared venv's own ``module`` as the canary's probes call it: each function of ``names`` with the
    release's signature (read with ast; nothing imported), recording how it was called."""
    import ast
    import types
    v = CACHE / "venvs" / venv
    need((v / ".deployer-installed").exists(), f"prepared {venv} venv missing (scripts/dev.sh prepares it)")
    src = (glob.glob(str(v / f"lib/python3*/site-packages/{module}")) or [None])[0]
    tree = ast.parse(open(src).read())
    calls, ns = [], {}
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef) and fn.name in names:
            for a in fn.args.args + fn.args.kwonlyargs:
                a.annotation = None
            fn.returns, fn.decorator_list = None, []
            fn.args.defaults = [ast.Constant(None) for _ in fn.args.defaults]
            fn.args.kw_defaults = [ast.Constant(None) if d is not None else None for d in fn.args.kw_defaults]
            fn.body = ast.parse(f"return __calls__.append(({fn.name!r}, dict(locals()))) or __out__").body
            module = ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[]))
            exec(compile(module, src, "exec"),
                 dict(__calls__=calls, __out__=out or types.SimpleNamespace(shape=(8, 512))), ns)
    return types.SimpleNamespace(**ns), calls


class _Torch:
    """As much of torch as the probes touch before and after the kernel (no GPU here)."""
    int32 = float32 = "dtype"

    class cuda:
        @staticmethod
        def synchronize():
            pass

    def zeros(self, shape, **kw):
        return ("tensor", shape)

    empty = randn = zeros


@pytest.mark.parametrize("venv", ["vllm-0.16.0", "vllm-0.18.0", "vllm-0.33.0"])
def test_the_canarys_vllm_probes_call_each_releases_own_kernels_as_it_declares_them(venv, monkeypatch):
    """The canary asks the release's kernels with the release's own signature: gptq_marlin_repack takes a perm tensor
    in 0.16/0.18 and none in 0.33 (a wrong call would refuse a good deploy before its restart: exit 4)."""
    import sys
    import types
    sys.path.insert(0, str(ROOT / "roles/canary/files"))
    try:
        import gpu_canary
    finally:
        sys.path.pop(0)
    ops, calls = _release_ops(venv)
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(_custom_ops=ops))
    monkeypatch.setitem(sys.modules, "vllm._custom_ops", ops)
    assert gpu_canary._probe_vllm_marlin_repack(_Torch()) == {"shape": [8, 512]}
    assert gpu_canary._probe_vllm_moe_topk(_Torch()) == {"experts": 384, "topk": 8}
    repack, topk = dict(calls)["gptq_marlin_repack"], dict(calls)["topk_softmax"]
    assert (repack["size_k"], repack["size_n"], repack["num_bits"]) == (128, 256, 4), repack
    assert ("perm" in repack) == (venv != "vllm-0.33.0"), repack
    assert topk["gating_output"] == ("tensor", (4, 384)) and topk["topk_ids"] == ("tensor", (4, 8)), topk
    # the Marlin MoE GEMM: every argument the release declares is one the probe supplies, by its own name
    case = {k: ("tensor", k) for k in ("x", "scales", "sorted_token_ids", "expert_ids", "num_tokens_past_padded",
                                       "topk_weights")} | {"block": 16, "top_k": 2, "tokens": 16, "size_n": 256,
                                                           "size_k": 256}
    args = gpu_canary.by_signature(ops.moe_wna16_marlin_gemm,
                                   gpu_canary.marlin_moe_gemm_args(case, "qweight", "out", "workspace", "uint4b8"))
    ops.moe_wna16_marlin_gemm(**args)
    gemm = dict(calls)["moe_wna16_marlin_gemm"]
    assert (gemm["input"], gemm["b_qweight"], gemm["b_q_type"]) == (("tensor", "x"), "qweight", "uint4b8"), gemm
    assert (gemm["size_m"], gemm["size_n"], gemm["size_k"], gemm["moe_block_size"]) == (16, 256, 256, 16), gemm
    assert ("perm" in gemm and "is_k_full" in gemm) == (venv != "vllm-0.33.0"), sorted(gemm)


def test_a_release_that_asks_the_marlin_moe_gemm_for_more_is_skipped_not_failed():
    """A release whose kernel wants an argument the canary does not know: TypeError (the rank reports the probe
    skipped, naming it), not a call with a missing argument."""
    import sys
    sys.path.insert(0, str(ROOT / "roles/canary/files"))
    try:
        import gpu_canary
    finally:
        sys.path.pop(0)

    def moe_wna16_marlin_gemm(input, b_qweight, new_thing, size_m=0):    # noqa: A002 - vLLM's own names
        pass
    with pytest.raises(TypeError, match="asks for new_thing"):
        gpu_canary.by_signature(moe_wna16_marlin_gemm, {"input": 1, "b_qweight": 2, "size_m": 3, "perm": 4})
    assert gpu_canary.by_signature(moe_wna16_marlin_gemm, {"input": 1, "b_qweight": 2, "new_thing": 0,
                                                           "perm": 4}) == {"input": 1, "b_qweight": 2,
                                                                           "new_thing": 0}


class _TorchForSampling(_Torch):
    """As much of torch as the FlashInfer probe touches: the probabilities, the wanted tokens, the comparison."""
    int64 = "int64"

    class _T(tuple):
        def __setitem__(self, key, value):
            pass

        def __truediv__(self, other):
            return self

        def sum(self, **kw):
            return self

        def to(self, dtype):
            return self

        def tolist(self):
            return list(self)

    def rand(self, shape, *fill, **kw):
        return self._T(("probs", shape))

    def tensor(self, values, **kw):
        return self._T(values)

    arange = ones = full = rand

    @staticmethod
    def equal(a, b):
        return True


def test_the_sglang_canary_calls_flashinfer_sampling_as_sglang_does_with_flashinfer_s_own_signature(monkeypatch):
    """The SGLang canary's FlashInfer probe binds to the prepared SGLang venv's flashinfer.sampling signature (read
    with ast: nothing imported), with the arguments SGLang's sampler passes (srt/layers/sampler.py): the
    probabilities, an int32 top_k and a float32 top_p tensor, filter_apply_order="joint"."""
    import sys
    import types
    sys.path.insert(0, str(ROOT / "roles/canary/files"))
    try:
        import gpu_canary
    finally:
        sys.path.pop(0)
    sampling, calls = _release_ops("sglang-0.5.23", "flashinfer/sampling.py", ("top_k_top_p_sampling_from_probs",),
                                   out=_TorchForSampling._T((7, 81920, 163839, 12345)))
    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(sampling=sampling, __version__="0.7.2"))
    monkeypatch.setitem(sys.modules, "flashinfer.sampling", sampling)
    assert gpu_canary._probe_sglang_flashinfer_sampling(_TorchForSampling()) == {"vocab": 163840,
                                                                                  "flashinfer": "0.7.2"}
    call = dict(calls)["top_k_top_p_sampling_from_probs"]
    assert call["top_k"] == ("probs", (4,)) and call["top_p"] == ("probs", (4,)), call
    assert call["filter_apply_order"] == "joint", call
    assert "sglang_flashinfer_sampling" in gpu_canary.RANK0_PROBES


@pytest.mark.parametrize("venv", ["vllm-0.16.0", "vllm-0.18.0", "vllm-0.33.0"])
def test_the_canarys_fa2_probe_binds_to_each_releases_flash_attention(venv):
    """FA2 (the EAGLE-3 drafter's attention) is PTX only on sm_120 in every supported release: the canary's call
    binds to each release's own flash_attn_varlen_func by name, FA2 asked for explicitly."""
    import sys
    sys.path.insert(0, str(ROOT / "roles/canary/files"))
    try:
        import gpu_canary
    finally:
        sys.path.pop(0)
    fa, calls = _release_ops(venv, "vllm/vllm_flash_attn/flash_attn_interface.py", ("flash_attn_varlen_func",))
    fa.flash_attn_varlen_func(**gpu_canary.by_signature(fa.flash_attn_varlen_func,
                                                        gpu_canary.fa2_args("q", "k", "v", "cu", 11, 128)))
    call = dict(calls)["flash_attn_varlen_func"]
    assert (call["q"], call["cu_seqlens_k"], call["max_seqlen_q"], call["causal"], call["fa_version"]) == (
        "q", "cu", 11, True, 2), call
    assert call["softmax_scale"] == 128 ** -0.5
    libs, _ = read(venv)
    assert libs["vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"]["ptx_only"] > 0      # why the canary calls it
