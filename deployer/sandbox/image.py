"""Sandbox hosts' images: what a host's private overlay root holds before it boots (hosts.py boots it).

sshd's config and the controller's key, systemd's wants cleared, a sudo login user on a sudo host, the simulated GPU
box (nvidia-smi, a CUDA toolkit's nvcc, every engine's stand-in and the canary rank, the rehearsal knobs), the model
directories, the real engine's files on a real-engine host, the host's package cache hard-linked from the
controller's uv cache, and a pre-baked seed's finished venvs and verdicts (hosts.save_seed).  docs/sandbox.md.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from deployer import tools
from deployer.sandbox import common, real_engine
from deployer.sandbox.checkpoints import write_model_dir
from deployer.sandbox.common import (
    DEPLOY_ROOT,
    HERE,
    KNOBS_DIR,
    MODEL_DIR,
    SMALL_MODEL_DIR,
    STANDIN_ANSWER,
    STANDIN_ANSWERS,
    STANDIN_SEED,
    SUDO_UID,
    SUDO_USER,
    Host,
    controller_cache,
    is_real,
    is_sudo,
)
from deployer.sandbox.common import run as _run

SSHD_CONFIG = """\
Port 22
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
UseDNS no
Subsystem sftp internal-sftp
MaxStartups 100:30:200
MaxSessions 64
AcceptEnv LANG LC_*
"""


def uv_cache_dir() -> Path:
    """The controller's uv cache (what ``scripts/dev.sh`` filled), from the uv the deployer ships with."""
    out = _run(tools.uv(), "cache", "dir", check=False)
    return Path(out.stdout.strip() or Path.home() / ".cache" / "uv")


def prepared_venvs_dir() -> Path:
    """Where ``scripts/dev.sh`` keeps the engines' venvs it installed from the uv cache (their files are hard links
    of the cache's unpacked wheels)."""
    return controller_cache() / "venvs"


def cache_slice(cache: Path, venvs: tuple[str, ...]) -> list[Path]:
    """The uv cache's unpacked wheels (``archive-v0/<id>``) that the prepared venvs ``venvs`` (names under
    ``prepared_venvs_dir()``) were installed from: an install of the same engine resolves to the same wheels, so a
    host that installs only these engines needs only these.  Matched by inode (uv hard-links a wheel's files into
    a venv): each venv's ``*.dist-info/METADATA`` is its archive's own file.  KeyError names a venv not prepared."""
    by_inode = {}
    for meta in (cache / "archive-v0").glob("*/*.dist-info/METADATA"):
        by_inode[meta.stat().st_ino] = meta.parent.parent
    out = set()
    for name in venvs:
        d = prepared_venvs_dir() / name
        if not (d / ".deployer-installed").is_file():
            raise KeyError(f"{name}: no prepared venv at {d} (scripts/dev.sh prepares it)")
        out.update(by_inode[m.stat().st_ino] for m in d.glob("lib/python3*/site-packages/*.dist-info/METADATA")
                   if m.stat().st_ino in by_inode)
    return sorted(out)


def link_package_cache(dst: Path, venvs: tuple[str, ...] | None) -> None:
    """The controller's uv cache hard-linked into ``dst``: all of it (~280,000 entries: ~9 CPU-s to link and unlink
    again), or, with ``venvs``, the cache's indexes and only the unpacked wheels those engines were installed from
    (vLLM 0.16.0's: ~73,000)."""
    cache = uv_cache_dir()
    if not cache.is_dir():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    if venvs is None:
        _run("cp", "-al", cache, dst)
        return
    dst.mkdir(exist_ok=True)
    rest = [p for p in cache.iterdir() if p.name != "archive-v0"]
    if rest:
        _run("cp", "-al", *rest, dst)
    wheels = cache_slice(cache, venvs)
    (dst / "archive-v0").mkdir(exist_ok=True)
    if wheels:
        _run("cp", "-al", *wheels, dst / "archive-v0")


def prepare_upper(h: Host, pubkey: str, seed: Path | None = None,
                  package_cache: bool | tuple[str, ...] = True) -> Path:
    d = h.dir
    upper, work, merged = d / "upper", d / "work", d / "merged"
    for p in (upper, work, merged):
        p.mkdir(parents=True, exist_ok=True)
    opaque = []

    def mk(rel, mode=0o755):
        p = upper / rel
        p.mkdir(parents=True, exist_ok=True)
        os.chmod(p, mode)
        return p

    root = mk("root", 0o700)
    opaque += [root, mk("tmp", 0o1777), mk("var/lib/deployer-sandbox"), mk("opt/deployer")]
    for f in (".bashrc", ".profile"):
        shutil.copy(f"/etc/skel/{f}", root / f)
    ssh = mk("root/.ssh", 0o700)
    (ssh / "authorized_keys").write_text(pubkey)
    os.chmod(ssh / "authorized_keys", 0o600)
    etc_ssh = mk("etc/ssh")
    for f in ("ssh_host_ed25519_key", "ssh_host_ed25519_key.pub"):
        shutil.copy(d / f, etc_ssh / f)
    os.chmod(etc_ssh / "ssh_host_ed25519_key", 0o600)
    (etc_ssh / "sshd_config").write_text(SSHD_CONFIG if not is_sudo(h) else
                                         SSHD_CONFIG.replace("PermitRootLogin prohibit-password", "PermitRootLogin no"))
    if is_sudo(h):
        add_sudo_user(upper, mk, pubkey)
    (upper / "etc/hostname").write_text(h.name + "\n")
    (upper / "etc/hosts").write_text(f"127.0.0.1 localhost\n{h.ip} {h.name}\n")
    (upper / "etc/machine-id").write_text(os.urandom(16).hex() + "\n")
    sysd = mk("etc/systemd/system")
    for w in ("multi-user.target.wants", "timers.target.wants", "getty.target.wants", "sysinit.target.wants"):
        opaque.append(mk(f"etc/systemd/system/{w}"))
    (sysd / "multi-user.target.wants/ssh.service").symlink_to("/lib/systemd/system/ssh.service")
    # Debian's node_exporter (scripts/dev.sh installs it here): a host's own monitoring, which serves the state
    # keeper's deployer.prom from its textfile directory on :9100 (docs/monitoring.md)
    exporter = Path("/lib/systemd/system/prometheus-node-exporter.service")
    if exporter.exists() and not common.is_balancer(h):
        (sysd / "multi-user.target.wants/prometheus-node-exporter.service").symlink_to(str(exporter))
        # SANDBOX: the textfile collector only.  The host's CPU, disks and network are this machine's, and the
        # default collectors cost ~35 ms of CPU a scrape (a test's Prometheus scrapes twice a second)
        (mk("etc/default") / "prometheus-node-exporter").write_text(
            'ARGS="--collector.disable-defaults --collector.textfile"\n')
    for u in ("console-getty.service", "getty@.service", "serial-getty@.service", "postgresql.service",
              "postgresql@.service", "systemd-timesyncd.service", "e2scrub_reap.service",
              "apt-daily.service", "apt-daily-upgrade.service", "man-db.service"):
        p = sysd / u
        if not p.exists() and not p.is_symlink():
            p.symlink_to("/dev/null")
    # the simulated GPU box
    bin_ = mk("usr/local/bin")
    shutil.copy(HERE / "nvidia_smi.py", bin_ / "nvidia-smi")
    os.chmod(bin_ / "nvidia-smi", 0o755)
    # the CUDA toolkit's nvcc as FlashInfer's JIT finds it (on PATH): the verify stage's toolchain check for SGLang
    # looks for it; it compiles nothing (SANDBOX: no GPU code is built or run here)
    (bin_ / "nvcc").write_text("#!/bin/sh\n# SANDBOX ONLY: a CUDA toolkit's nvcc (deployer/sandbox/image.py)\n"
                               "[ \"$1\" = --version ] && { echo 'Cuda compilation tools, release 13.0, V13.0.88'; "
                               "exit 0; }\necho 'SANDBOX nvcc: compiles nothing' >&2; exit 1\n")
    os.chmod(bin_ / "nvcc", 0o755)
    # and that toolkit's cuRAND headers, where FlashInfer's JIT looks (<nvcc's parent's parent>/include: its sampling
    # kernels include them); SANDBOX: a marker file, nothing is compiled
    mk("usr/local/include")
    (upper / "usr/local/include/curand_kernel.h").write_text("/* SANDBOX ONLY: a CUDA toolkit's cuRAND header "
                                                             "(deployer/sandbox/image.py) */\n")
    lib = mk("usr/local/lib/deployer-sandbox")
    # every engine's stand-in (<engine>_standin*.py) and what they share (standin_*.py): no list to keep, a new
    # engine's stand-in is copied by its name; and one GPU canary rank, simulated
    for f in sorted(HERE.glob("*standin*.py")) + [HERE / "canary_rank.py"]:
        shutil.copy(f, lib / f.name)
    # the stand-in's own bookkeeping (argv.json, ready/died marks): it runs as the unprivileged service
    # user under ProtectSystem=strict, so the directory is made at boot and allowed in the inventory
    tmpfiles = mk("etc/tmpfiles.d")
    conf = "d /run/deployer-standin 1777 root root -\n"
    # the stand-in's answers of the real supports_eagle3() (keyed by the contents of the venv's files that decide
    # them), from a pre-baked image (save_seed) and from earlier hosts on this machine (hosts.stop keeps them in
    # STANDIN_ANSWERS), copied in at each boot: SANDBOX bookkeeping
    answers = {}
    for src in ([seed / ".standin"] if seed else []) + [STANDIN_ANSWERS]:
        if src.is_dir():
            for f in sorted(src.iterdir()):
                if STANDIN_ANSWER.fullmatch(f.name):      # a name with a space or line end would break the line
                    answers.setdefault(f.name, f)
    if answers:
        keep = mk(STANDIN_SEED.lstrip("/"))
        for name, f in sorted(answers.items()):
            shutil.copy2(f, keep / name)
            conf += f"C /run/deployer-standin/{name} - - - - {STANDIN_SEED}/{name}\n"
    (tmpfiles / "deployer-standin.conf").write_text(conf)
    knobs = mk(KNOBS_DIR.lstrip("/"))
    (knobs / "gpus.json").write_text("{}\n")
    (knobs / "standin.json").write_text("{}\n")
    (knobs / "README").write_text("SANDBOX host: nvidia-smi and the vLLM stand-in read these rehearsal knobs.\n")
    write_model_dir(upper / MODEL_DIR.lstrip("/"), header_true=True)
    write_model_dir(upper / SMALL_MODEL_DIR.lstrip("/"))
    if is_real(h):
        real_engine.write_host_files(upper)
    # the host's package cache, hard-linked from the controller's uv cache (see module docstring), only for a host
    # that may install (``package_cache``: True for all of it, or the prepared venvs whose engines it may install)
    if package_cache:
        link_package_cache(upper / DEPLOY_ROOT.lstrip("/") / "cache" / "uv",
                           None if package_cache is True else tuple(package_cache))
    # a pre-baked image (save_seed): finished venvs another sandbox host's deploy made, hard-linked in like the uv
    # cache (their files are the cache's own links); the deployer finds them complete and installs nothing
    if seed and seed.is_dir():
        venvs = mk(DEPLOY_ROOT.lstrip("/") + "/venvs")
        for v in sorted(seed.iterdir()):
            if not v.name.startswith(".") and (v / ".deployer-installed").is_file():
                _run("cp", "-al", v, venvs / v.name)
        if (seed / ".verify").is_dir():
            verdicts = mk(DEPLOY_ROOT.lstrip("/") + "/cache/verify")
            for f in (seed / ".verify").glob("*.json"):
                shutil.copy2(f, verdicts / f.name)
    for p in opaque:
        os.setxattr(p, "trusted.overlay.opaque", b"y")
    return merged


def add_sudo_user(upper: Path, mk, pubkey: str) -> None:
    """SANDBOX: the login user of a sudo host: passwordless sudo, the controller's key, no root login."""
    etc = upper / "etc"
    for name, line in (("passwd", f"{SUDO_USER}:x:{SUDO_UID}:{SUDO_UID}:deployer sandbox sudo user:"
                                  f"/home/{SUDO_USER}:/bin/bash"),
                       ("group", f"{SUDO_USER}:x:{SUDO_UID}:"), ("shadow", f"{SUDO_USER}:*:19000:0:99999:7:::")):
        text = Path(f"/etc/{name}").read_text()
        (etc / name).write_text(text + ("" if text.endswith("\n") else "\n") + line + "\n")
    os.chmod(etc / "shadow", 0o640)
    home = mk(f"home/{SUDO_USER}", 0o750)
    ssh_dir = mk(f"home/{SUDO_USER}/.ssh", 0o700)
    (ssh_dir / "authorized_keys").write_text(pubkey)
    os.chmod(ssh_dir / "authorized_keys", 0o600)
    for p in (home, ssh_dir, ssh_dir / "authorized_keys"):
        os.chown(p, SUDO_UID, SUDO_UID)
    sudoers = mk("etc/sudoers.d", 0o750)
    (sudoers / SUDO_USER).write_text(f"{SUDO_USER} ALL=(ALL:ALL) NOPASSWD: ALL\n")
    os.chmod(sudoers / SUDO_USER, 0o440)
