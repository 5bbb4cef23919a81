"""Where a sandbox lives: its slot, bridge, addresses and state directory, the host record, and the few facts
about a host that every other part asks (its role on disk).  hosts.py runs the machines, inventory.py writes the
controller's client files for them, checkpoints.py makes the simulated model and drafter files."""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from deployer import tools

# Independent sandboxes side by side (parallel test modules): DEPLOYER_SANDBOX_SLOT=N gives its own bridge,
# subnet, namespaces, state directory and SSH control sockets.  Slot 0 is the default.
SLOT = int(os.environ.get("DEPLOYER_SANDBOX_SLOT", "0") or 0)
BRIDGE = f"dpsbx{SLOT}"
NET = f"10.{77 + SLOT}.0"
STATE = Path(os.environ.get("DEPLOYER_SANDBOX_DIR") or
             ("/var/lib/deployer-sandbox" + (f"-{SLOT}" if SLOT else "")))
HERE = Path(__file__).resolve().parent
# The controller's checkout, visible read-only at the same path inside sandbox hosts (wherever it lives,
# /tmp included) so a test can run the controller side on a host that boots systemd (schedule timers).
# Deploys never use it: Ansible ships what a host needs.
REPO = HERE.parent.parent
MODEL_DIR = "/srv/models/Kimi-K2.5"
# SANDBOX: the same config with 64 shards of one 16-byte tensor each: a checkpoint a laptop can prewarm whole (the
# header-true MODEL_DIR is ~595 GB, sparse; the prewarm skips it as it would on a host with less RAM)
SMALL_MODEL_DIR = "/srv/models/Kimi-K2.5-small"
KNOBS_DIR = "/etc/deployer-sandbox"
STANDIN_SEED = "/var/lib/deployer-sandbox/standin-seed"   # the seed's stand-in answers (root's, read-only to it)
# the stand-in's answers kept on this machine between hosts and runs (keyed by the files that decide them: a host
# whose venv holds the same files gets them at boot; vllm_standin.py): the controller user's own cache
def controller_cache() -> Path:
    """The controller user's own deployer cache (what scripts/dev.sh fills: ~/.cache/deployer)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "deployer"


STANDIN_ANSWERS = controller_cache() / "standin-answers"
# the stand-in's answer files (vllm_standin.py names them so): the only names saved, and restored into a tmpfiles.d line
STANDIN_ANSWER = re.compile(r"eagle3-[0-9a-f]{16}\.json")
STANDIN_PATH = "/usr/local/lib/deployer-sandbox/vllm_standin.py"
CANARY_RANK_PATH = "/usr/local/lib/deployer-sandbox/canary_rank.py"
DEPLOY_ROOT = "/opt/deployer"
APT_PACKAGES = ("openssh-server", "openssh-client", "rsync", "systemd-container", "iproute2", "sudo")
# A "sudo host" (`deployer sandbox start --sudo`) refuses root over SSH, as many production hosts do: the deployer
# logs in as this user and becomes root with sudo (Ansible become).
SUDO_USER, SUDO_UID = "deploy", 4242


class SandboxError(RuntimeError):
    pass


@dataclass
class Host:
    name: str
    ip: str

    @property
    def dir(self) -> Path:
        return STATE / self.name


def run(prog, *args, check=True, **kw):
    """Run a system program found by ``tools.system`` (never the caller's PATH)."""
    exe = prog if os.path.isabs(str(prog)) else tools.system(prog)
    return subprocess.run([exe, *(str(a) for a in args)], check=check, text=True, capture_output=True, **kw)


def host(i: int) -> Host:
    return Host(f"sbx{i}", f"{NET}.{10 + i}")


def hosts_on_disk() -> list[Host]:
    if not STATE.exists():
        return []
    out = []
    for d in sorted(STATE.glob("sbx*")):
        if d.name[3:].isdigit():
            out.append(host(int(d.name[3:])))
    return out


def _role(h: Host) -> str:
    return (h.dir / "role").read_text().strip() if (h.dir / "role").exists() else ""


def is_balancer(h: Host) -> bool:
    return _role(h) == "balancer"


def is_real(h: Host | str) -> bool:
    """A host that serves the real vLLM (``start(real_engine=True)``; real_engine.py)."""
    return _role(host(int(h[3:])) if isinstance(h, str) else h) == "real"


def is_sudo(h: Host | str) -> bool:
    """A host that refuses root over SSH (``start(sudo=True)``)."""
    return _role(host(int(h[3:])) if isinstance(h, str) else h) == "sudo"
