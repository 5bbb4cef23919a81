"""Helpers shared by the sandbox test modules."""
import os
import shutil
import subprocess
import sys
import time

import pytest

from helpers import ROOT

SVC = "deployer-vllm"

needs_sandbox = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("systemd-nspawn"),
                                   reason="sandbox tests need root and systemd-nspawn (scripts/dev.sh installs it)")


def deployer(*args, timeout=900, env=None):
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "deployer.cli", *args], capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT, env=env)
    r.seconds = time.time() - t0
    return r


def up(*args, **kw):
    return deployer("up", "--sandbox", *args, **kw)


def sh(host, cmd, check=True):
    from deployer.sandbox import hosts as sb
    return sb.ssh(host, cmd, check=check).stdout.strip()


def main_pid(host):
    return sh(host, f"systemctl show -p MainPID --value {SVC}")


STAGE_NAMES = ("preflight", "install", "patch", "drafter", "render", "verify", "start", "watch", "smoke",
               "release", "rollback")


def stages(text, host):
    """The stage lines of human output for one host: {stage: outcome} (`  12.3s sbx1 patch changed 1.2s ...`)."""
    out = {}
    for line in text.splitlines():
        w = line.split()
        if len(w) >= 4 and w[1] == host and w[2] in STAGE_NAMES:
            out[w[2]] = w[3]
    return out


def flat(text):
    return " ".join(text.split())


def sandbox_hosts(n):
    """Module fixture body: fresh sandbox hosts sbx1..sbxN for the module, stopped afterwards."""
    from deployer.sandbox import hosts as sb
    sb.stop()
    sb.start(n)
    yield sb
    sb.stop()
