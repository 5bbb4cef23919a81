"""The run-time toolchain's verdict (deployer/host_checks.py toolchain_refusal): Triton's C compiler and Python.h
for every engine, FlashInfer's nvcc, ninja and c++ for an engine that declares them (SGLang)."""
from deployer import engines
from deployer.host_checks import toolchain_refusal

GOOD = {"cc": "/usr/bin/gcc", "cc_found": True, "include": "/usr/include/python3.11", "python_h": True,
        "path": "/v/bin:/usr/bin", "python": "/v/bin/python",
        "programs": {"nvcc": {"found": True, "how": ""}, "ninja": {"found": True, "how": ""},
                     "c++": {"found": True, "how": ""}, "curand": {"found": True, "how": ""}}}
VLLM, SGLANG = engines.describe("vllm"), engines.describe("sglang")


def test_everything_there_passes_for_both_engines():
    assert toolchain_refusal(GOOD, VLLM, "vllm") is None and toolchain_refusal(GOOD, SGLANG, "vllm") is None


def test_no_nvcc_refuses_sglang_only_with_how_it_was_looked_for():
    tc = dict(GOOD, programs=dict(GOOD["programs"], nvcc={"found": False,
                                                          "how": "CUDA_HOME=/opt/no-cuda: no /opt/no-cuda/bin/nvcc"}))
    assert toolchain_refusal(tc, VLLM, "vllm") is None          # vLLM's kernels are prebuilt (and PTX): no nvcc
    assert toolchain_refusal(tc, SGLANG, "vllm") == (
        "run-time toolchain, as the service user vllm in the unit's environment: nvcc: measured none (CUDA_HOME="
        "/opt/no-cuda: no /opt/no-cuda/bin/nvcc), expected the CUDA toolkit (its nvcc), or CUDA_HOME in "
        "deployer_env_extra; SGLang's FlashInfer compiles its kernels at run time with them "
        "(flashinfer/jit/cpp_ext.py), after the load.")


def test_a_toolkit_without_curand_s_headers_refuses_sglang_naming_where_it_looked():
    """FlashInfer 0.7's sampling kernels include curand_kernel.h from the toolkit's include directory only
    (flashinfer/data/include/flashinfer/sampling.cuh; its JIT adds no other CUDA include path): an nvcc-only toolkit
    passes the nvcc check and fails the compile at SGLang's first sampled request ("fatal error: curand.h: No such
    file or directory", measured on this project's machine with CUDA 13.0's nvcc)."""
    tc = dict(GOOD, programs=dict(GOOD["programs"], curand={"found": False,
                                                            "how": "no /usr/local/cuda/include/curand_kernel.h"}))
    assert toolchain_refusal(tc, VLLM, "vllm") is None
    assert toolchain_refusal(tc, SGLANG, "vllm") == (
        "run-time toolchain, as the service user vllm in the unit's environment: curand: measured none (no "
        "/usr/local/cuda/include/curand_kernel.h), expected cuRAND's headers in the CUDA toolkit's include directory "
        "(its development package, of nvcc's CUDA version; FlashInfer's sampling kernels include them and its JIT "
        "looks nowhere else); SGLang's FlashInfer compiles its kernels at run time with them "
        "(flashinfer/jit/cpp_ext.py), after the load.")


def test_no_c_compiler_is_said_as_before_for_triton():
    tc = dict(GOOD, cc=None, cc_found=False, path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin")
    assert toolchain_refusal(tc, VLLM, "vllm") == (
        "run-time toolchain, as the service user vllm in the unit's environment: C compiler: measured none (CC "
        "unset; no gcc or clang on /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin), expected one (install gcc, "
        "or set CC in deployer_env_extra); Triton compiles its kernels' launchers with them at run time "
        "(triton/runtime/build.py), after the load.")


def test_an_old_probe_without_programs_refuses_sglang_rather_than_passing():
    tc = {k: v for k, v in GOOD.items() if k != "programs"}
    assert "nvcc: measured none (not looked for)" in toolchain_refusal(tc, SGLANG, "vllm")


def test_sglangs_unit_has_its_venv_first_on_path_and_vllms_sets_none():
    from test_sglang_backend import BASE, MANIFEST, sg

    from deployer import plan
    p = sg()
    assert p["env"]["PATH"] == f"{p['venv']}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
    assert p["engine"]["jit_toolchain"] == ["nvcc", "ninja", "c++", "curand"]
    assert "PATH" not in plan.make_plan(dict(BASE, backend="vllm"), dict(MANIFEST))["env"]
