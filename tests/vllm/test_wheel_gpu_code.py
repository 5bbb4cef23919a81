"""The GPU code in the engine wheels the deployer installs (the prepared venvs), read as the verify stage reads it on a
host: vLLM 0.16/0.18's Kimi kernels carry only PTX 8.8 for sm_120 (driver >= 575.51.03), 0.33 needs CUDA 13's 580;
the numbers of the scan in issue 42's review."""
import glob

import pytest

from deployer import driver_floor as df
from deployer.ansible_plugins.module_utils import fatbin
from deployer.engines import get
from helpers import CACHE, need

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
