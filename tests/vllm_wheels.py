"""Real vLLM releases from the package index: wheels (--no-deps) cached under ~/.cache/deployer/wheels."""
import subprocess
import sys
import zipfile
from pathlib import Path

from helpers import CACHE

WHEELS = CACHE / "wheels"
FILES = ("vllm/model_executor/models/deepseek_v2.py", "vllm/model_executor/models/kimi_k25.py",
         "vllm/config/speculative.py", "vllm/v1/spec_decode/eagle.py", "vllm/v1/spec_decode/llm_base_proposer.py",
         "vllm/_version.py", "vllm/version.py", "vllm/__init__.py", "vllm/envs.py",
         "vllm/v1/spec_decode/dynamic/utils.py",
         # Model Runner V2's EAGLE speculator (the only one from 0.34 on)
         "vllm/v1/worker/gpu/spec_decode/eagle/speculator.py", "vllm/v1/worker/gpu/spec_decode/eagle/utils.py",
         "vllm/v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py")


def wheel(version: str) -> Path:
    WHEELS.mkdir(parents=True, exist_ok=True)
    found = sorted(WHEELS.glob(f"vllm-{version}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.11", "-d", str(WHEELS), f"vllm=={version}"], check=True)
        found = sorted(WHEELS.glob(f"vllm-{version}-*.whl"))
    return found[0]


def extract(version: str, dest: Path) -> Path:
    """The patch engine's target files exactly as the wheel ships them."""
    with zipfile.ZipFile(wheel(version)) as z:
        names = set(z.namelist())
        for f in FILES:
            if f in names:
                z.extract(f, dest)
    return dest / "vllm"

