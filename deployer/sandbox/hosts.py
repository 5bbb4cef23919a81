"""Sandbox hosts: real sshd + real systemd on this machine, with a simulated GPU box inside.

This module runs the machines (boot, reboot, stop, pre-baked seeds, ssh into them); image.py prepares what a host
holds before it boots, common.py says where a sandbox lives, inventory.py writes the controller's client files,
checkpoints.py the simulated model and drafter.

Each host is a ``systemd-nspawn --boot`` container (systemd is PID 1, so unit files,
``systemctl`` and ``journalctl`` are the real ones) in its own network namespace on
the bridge ``dpsbx0`` (10.77.0.1/24, host N at 10.77.0.(10+N), no route anywhere
else), with a private overlay root: lower layer = this machine's ``/``, upper layer
on disk under the state dir (a vLLM venv is ~10 GB: RAM-backed layers would not do).

What is simulated lives in ``deployer/sandbox/`` and is provisioned by image.py:
``/usr/local/bin/nvidia-smi`` (8x RTX PRO 6000 Blackwell), a Kimi-K2.5-shaped model
directory, the vLLM stand-in server, and the rehearsal knobs in /etc/deployer-sandbox/.

Packages: the hosts have no route to a package index, like many production GPU
hosts.  The deployer installs vLLM with ``uv --offline`` from the host's uv cache
(``install_offline``); the sandbox pre-seeds that cache by hard-linking the
controller's uv cache into the host's upper layer (0.9 s for 10 GB, no extra disk).
The controller's cache is filled by ``scripts/dev.sh`` (a real install of each vLLM
release the tests use, from the index).  On a real offline host the same role variable works after the
cache is seeded (rsync), or use ``install_wheelhouse_dir``.

Pitfalls handled (docs/sandbox.md): clean /root (no pyenv in
.bashrc), opaque *.target.wants, fresh machine-id, never SIGTERM the container's
systemd (SIGTERM nspawn instead), close ssh ControlPersist masters before tearing
the bridge down.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

from deployer import tools
from deployer.sandbox import image
from deployer.sandbox.common import (
    APT_PACKAGES,
    BRIDGE,
    DEPLOY_ROOT,
    KNOBS_DIR,
    NET,
    REPO,
    SLOT,
    STANDIN_ANSWER,
    STANDIN_ANSWERS,
    STATE,
    Host,
    SandboxError,
    host,
    hosts_on_disk,
    is_balancer,
    is_sudo,
)
from deployer.sandbox.common import run as _run
from deployer.sandbox.inventory import controller_key, write_client_files


# ------------------------------------------------------------------ lifecycle
def _machine(h: Host) -> str:
    """nspawn's machine name (unique per slot; the host's own hostname stays h.name, from /etc/hostname)."""
    return h.name if not SLOT else f"s{SLOT}-{h.name}"


def _netns(h: Host) -> str:
    return f"dps{SLOT or ''}-{h.name}"


def _ensure_bridge():
    if _run("ip", "link", "show", BRIDGE, check=False).returncode != 0:
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{NET}.1/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")


def is_running(h: Host) -> bool:
    pidf = h.dir / "launcher.pid"
    if not pidf.exists():
        return False
    try:
        stat = Path(f"/proc/{int(pidf.read_text())}/stat").read_text().split(") ")[1][0]
        return stat not in "ZX"
    except (OSError, ValueError, IndexError):
        return False


def start_host(i: int, seed: Path | None = None, package_cache: bool | tuple[str, ...] = True) -> Host:
    h = host(i)
    if is_running(h):
        return h
    _stop_host(h)  # leftovers of a crashed run
    key = controller_key()
    h.dir.mkdir(parents=True, exist_ok=True)
    if not (h.dir / "ssh_host_ed25519_key").exists():
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", h.name, "-f", h.dir / "ssh_host_ed25519_key")
    image.prepare_upper(h, Path(f"{key}.pub").read_text(), seed, package_cache)
    _ensure_bridge()
    ns = _netns(h)
    _run("ip", "link", "del", ns, check=False)
    _run("ip", "netns", "del", ns, check=False)
    _run("ip", "netns", "add", ns)
    _run("ip", "link", "add", ns, "type", "veth", "peer", "name", "eth0", "netns", ns)
    _run("ip", "link", "set", ns, "master", BRIDGE, "up")
    _run("ip", "-n", ns, "addr", "add", f"{h.ip}/24", "dev", "eth0")
    _run("ip", "-n", ns, "link", "set", "eth0", "up")
    _run("ip", "-n", ns, "link", "set", "lo", "up")
    _boot(h)
    return h


def _boot(h: Host) -> None:
    """Boot the host's container on its disk (the overlay's upper layer) in its network namespace."""
    d, ns = h.dir, _netns(h)
    script = (
        f"set -e; {tools.system('mount')} -t overlay overlay "
        f"-o lowerdir=/,upperdir={d}/upper,workdir={d}/work {d}/merged; "
        f"exec {tools.system('systemd-nspawn')} --quiet --register=no --keep-unit --link-journal=no --console=passive "
        f"-M {_machine(h)} -D {d}/merged --network-namespace-path=/run/netns/{ns} "
        f"--bind-ro={shlex.quote(str(REPO))} --boot"
    )
    log = open(d / "console.log", "a")
    p = subprocess.Popen([tools.system("unshare"), "--mount", "--propagation", "private", "--",
                          tools.system("bash"), "-c", script],
                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    (d / "launcher.pid").write_text(str(p.pid))


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def reboot(name: str, hard: bool = False, timeout: float = 120.0) -> float:
    """SANDBOX: reboot a host on its own disk, as an operator's reboot does (orderly: systemd stops every unit,
    then the machine starts again) or as a power cut does (``hard``: the container is killed, nothing is stopped).
    Everything on its disk stays (releases, venvs, the enabled unit); what lives in memory is gone.  Returns the
    seconds until it answers SSH again."""
    h = next((x for x in hosts_on_disk() if x.name == name), None)
    if h is None or not is_running(h):
        raise SandboxError(f"{name} is not a running sandbox host")
    t0 = time.time()
    launcher = int((h.dir / "launcher.pid").read_text())
    if hard:
        # kill the machine's init (nspawn's child): the kernel then kills every process of the container at once.
        # Killing nspawn itself would leave the container running, orphaned.
        for child in _children(launcher):
            os.kill(child, signal.SIGKILL)
    else:
        os.kill(launcher, signal.SIGTERM)     # nspawn asks the machine's systemd to shut down in order
    for _ in range(600):
        if not is_running(h):
            break
        time.sleep(0.1)
    else:
        raise SandboxError(f"{name} did not stop within 60 s")
    # the overlay was mounted in the launcher's private mount namespace: gone with it; its ssh masters too
    for c in list(STATE.glob(f"cp-*@{h.name}:*")) + list(STATE.glob(f"cp-*@{h.ip}:*")):
        c.unlink(missing_ok=True)
    shutil.rmtree(STATE / "cp-ansible", ignore_errors=True)
    (STATE / "cp-ansible").mkdir(exist_ok=True)
    _boot(h)
    wait_ssh(h, timeout)
    return time.time() - t0


def wait_ssh(h: Host, timeout: float = 60.0) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        r = _run("ssh", "-F", STATE / "ssh_config", "-o", "BatchMode=yes", "-o", "ConnectTimeout=2",
                 h.name, "systemctl is-system-running --wait >/dev/null 2>&1; true", check=False, timeout=30)
        if r.returncode == 0:
            return
        time.sleep(0.3)
    raise SandboxError(f"{h.name} ({h.ip}) did not answer ssh within {timeout:.0f} s; "
                       f"console: {(h.dir / 'console.log').read_text()[-2000:]}")


def start(n: int = 1, balancer: bool = False, sudo: bool = False, seed: Path | None = None,
          cold: tuple[int, ...] = (), package_cache: bool | tuple[str, ...] = True,
          real_engine: bool = False) -> list[Host]:
    """Hosts sbx1..sbxN (group gpu); with ``balancer`` one more, sbx<N+1>, running HAProxy (group balancer); with
    ``sudo`` the gpu hosts refuse root over SSH and the deployer logs in as ``deploy`` and uses sudo; with ``seed``
    (a directory save_seed filled) the gpu hosts boot with its finished venvs in place, but those numbered in
    ``cold``; ``package_cache=False``: the gpu hosts get no package cache (they can install nothing; the balancer
    never has one), a tuple of prepared venvs' names: only the wheels those engines were installed from
    (image.link_package_cache); ``real_engine``: the gpu hosts serve the real vLLM (its CPU build) and a tiny real
    Kimi-K2.5 (real_engine.py) instead of the stand-in."""
    if sudo and real_engine:
        raise SandboxError("a sandbox host is a sudo host or a real-engine host, not both")
    missing = [c for c in ("systemd-nspawn", "sshd", "ip", "unshare", "ssh", "ssh-keygen") if not tools.find(c)]
    if balancer and not tools.find("haproxy"):
        missing.append("haproxy")
    if missing:
        raise SandboxError(f"missing on this machine: {', '.join(missing)}; install: apt-get install -y "
                           + " ".join(APT_PACKAGES))
    for i in range(1, n + 1):
        (host(i).dir / "role").unlink(missing_ok=True)
        if sudo or real_engine:
            host(i).dir.mkdir(parents=True, exist_ok=True)
            (host(i).dir / "role").write_text("sudo\n" if sudo else "real\n")
    if balancer:
        lb = host(n + 1)
        lb.dir.mkdir(parents=True, exist_ok=True)
        (lb.dir / "role").write_text("balancer\n")
    hosts = [start_host(i, seed if i <= n and i not in cold else None, package_cache if i <= n else False)
             for i in range(1, n + 1 + (1 if balancer else 0))]
    write_client_files(sorted({h.name: h for h in hosts + hosts_on_disk() if is_running(h)}.values(),
                              key=lambda h: h.name))
    for h in hosts:
        wait_ssh(h)
    return hosts


def save_seed(h: Host, venv: str, seed: Path) -> bool:
    """Keep the finished venv ``venv`` of host ``h`` (its upper layer, on this machine's disk) in ``seed`` for
    later hosts (start(seed=...)): hard links, so instant and no extra disk.  Only a venv the deployer marked
    complete; the first one saved wins.  True when this call saved it."""
    src = h.dir / "upper" / venv.lstrip("/")
    dst = seed / Path(venv).name
    if dst.exists() or not (src / ".deployer-installed").is_file():
        return False
    seed.mkdir(parents=True, exist_ok=True)
    # the engine's verdicts that host cached (keyed by everything they depend on: argv, patches, model config,
    # platform, verifier), so that later hosts do not re-verify the same launch
    verdicts = h.dir / "upper" / DEPLOY_ROOT.lstrip("/") / "cache" / "verify"
    if verdicts.is_dir():
        (seed / ".verify").mkdir(exist_ok=True)
        for f in verdicts.glob("*.json"):
            shutil.copy2(f, seed / ".verify" / f.name)
    _save_standin_answers(h, seed / ".standin")
    tmp = seed / f".{dst.name}.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    _run("cp", "-al", src, tmp)
    try:
        os.rename(tmp, dst)
    except OSError:          # another process saved it first
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    return True


def _save_standin_answers(h: Host, dest: Path) -> None:
    """The stand-in's remembered supports_eagle3() answers on ``h`` (its tmpfs /run, so read over SSH) into
    ``dest``: later hosts' first load does not import vLLM's model classes again (~20 CPU-s each)."""
    r = ssh(h.name, "cd /run/deployer-standin 2>/dev/null && grep -H . eagle3-*.json || true", check=False,
            timeout=15)
    for line in r.stdout.splitlines():
        name, _, body = line.partition(":")
        if STANDIN_ANSWER.fullmatch(name) and body.startswith("{"):
            dest.mkdir(parents=True, exist_ok=True)
            if not (dest / name).exists():
                tmp = dest / f".{name}.{os.getpid()}"
                tmp.write_text(body + "\n")
                os.replace(tmp, dest / name)


def _stop_host(h: Host) -> None:
    pidf = h.dir / "launcher.pid"
    if pidf.exists():
        try:
            pid = int(pidf.read_text())
            # the launcher is bash exec'd into nspawn: SIGTERM to nspawn halts the container in order
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                if not is_running(h):
                    break
                time.sleep(0.1)
            else:   # the machine's init first: a killed nspawn alone would leave the container running
                for child in _children(pid):
                    os.kill(child, signal.SIGKILL)
                os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
        pidf.unlink(missing_ok=True)
    ns = _netns(h)
    _run("ip", "netns", "del", ns, check=False)
    _run("ip", "link", "del", ns, check=False)
    shutil.rmtree(f"/run/systemd/nspawn/propagate/{_machine(h)}", ignore_errors=True)
    if (h.dir / "merged").exists():
        _run("umount", "-l", h.dir / "merged", check=False)
    discard([h.dir / sub for sub in ("upper", "work", "merged")])


def discard(paths: list[Path]) -> None:
    """Remove directories without waiting for it: each is renamed into STATE/.trash at once (the same file system)
    and a detached ``rm -rf`` at the lowest priority deletes it.  A host's upper layer holds ~75,000 files (its
    venvs); unlinking them took ~10 s per host, nearly all of it waiting on the disk (1.5 s of CPU), and nothing
    needs them gone: the host's next start makes new directories.  One that cannot be moved is removed here."""
    trash = STATE / ".trash"
    moved = []
    for p in paths:
        if not os.path.lexists(p):
            continue
        trash.mkdir(mode=0o700, exist_ok=True)
        dest = trash / f"{p.parent.name}-{p.name}-{os.getpid()}-{time.monotonic_ns()}"
        try:
            os.rename(p, dest)
            moved.append(str(dest))
        except OSError:
            shutil.rmtree(p, ignore_errors=True)
    if moved:
        idle_io = [tools.system("ionice"), "-c", "3"] if tools.find("ionice") else []
        subprocess.Popen([*idle_io, tools.system("nice"), "-n", "19", tools.system("rm"), "-rf", "--one-file-system",
                          *moved],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)


def close_masters() -> None:
    """Close the controller's ssh ControlPersist masters (ours and Ansible's)."""
    for c in list(STATE.glob("cp-*")) + list((STATE / "cp-ansible").glob("*")):
        _run("ssh", "-o", f"ControlPath={c}", "-O", "exit", "x", check=False)


def stop(names: list[str] | None = None) -> list[str]:
    close_masters()
    stopped = []
    for h in hosts_on_disk():
        if names and h.name not in names:
            continue
        if is_running(h) and not is_balancer(h):
            try:         # what its stand-in learnt, for the next hosts (SANDBOX bookkeeping: image.py)
                _save_standin_answers(h, STANDIN_ANSWERS)
            except (OSError, subprocess.SubprocessError):
                pass
        _stop_host(h)
        (h.dir / "role").unlink(missing_ok=True)
        stopped.append(h.name)
    if not any(is_running(h) for h in hosts_on_disk()):
        time.sleep(0.3)
        _run("ip", "link", "del", BRIDGE, check=False)
    return stopped


def status() -> list[dict]:
    return [{"name": h.name, "ip": h.ip, "running": is_running(h)} for h in hosts_on_disk()]


def ssh(h: str, command: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a command on a sandbox host as root (tests and knobs; deploys go through Ansible); on a sudo host
    through ``sudo``."""
    if is_sudo(h):
        command = "sudo -n sh -c " + shlex.quote(command)
    r = _run("ssh", "-F", STATE / "ssh_config", "-o", "BatchMode=yes", h, command, check=False, timeout=timeout)
    if check and r.returncode != 0:
        raise SandboxError(f"ssh {h} {command!r}: rc={r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def copy_to(h: str, src: Path | str, dest: str, mode: str = "0755") -> None:
    """Put a file from this machine onto a sandbox host (tests and rehearsals)."""
    landing = f"/tmp/.upload-{os.getpid()}" if is_sudo(h) else dest     # the login user may not write dest
    r = _run("scp", "-q", "-F", STATE / "ssh_config", "-o", "BatchMode=yes", src, f"{h}:{landing}", check=False)
    if r.returncode != 0:
        raise SandboxError(f"scp {src} {h}:{dest}: rc={r.returncode}\n{r.stderr}")
    if landing != dest:
        ssh(h, f"mv {shlex.quote(landing)} {shlex.quote(dest)} && chown root:root {shlex.quote(dest)}")
    ssh(h, f"chmod {mode} {dest}")


# What the kernel says when a GPU logs an Xid (NVIDIA's driver, "NVRM: Xid (PCI:dddd:bb:dd): N, pid=..., name=...,
# text"); the sandbox's fake GPU i sits at PCI bus 0x18 + i (nvidia_smi.py)
XID_TEXT = {79: "GPU has fallen off the bus.", 119: "Timeout after 6s of waiting for RPC response from GPU0 GSP!",
            48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.",
            13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address"}
KERNEL_JOURNAL = "remote-sandbox-kernel.journal"


def kernel_xids(h: str, xid: dict) -> None:
    """Make the host's kernel log (``journalctl -k -b``, read as on a real host) hold an Xid line for each GPU index
    and number in ``xid`` ({"3": [79]}), or nothing of ours when it is empty.  A container's kernel messages are the
    host's, so the lines go into a journal file of their own beside the host's journal, written by
    systemd-journal-remote with the kernel's transport and this boot's id (journalctl merges the files it finds)."""
    entries = []
    for gpu, numbers in sorted((xid or {}).items()):
        for n in numbers:
            entries.append(f"NVRM: Xid (PCI:0000:{0x18 + int(gpu):02x}:00): {int(n)}, pid=4242, name=python3, "
                           + XID_TEXT.get(int(n), "sandbox Xid."))
    journal = f'/var/log/journal/"$(cat /etc/machine-id)"/{KERNEL_JOURNAL}'
    if not entries:
        ssh(h, f"rm -f {journal}")
        return
    export = "".join(f"__REALTIME_TIMESTAMP=@NOW@\n__MONOTONIC_TIMESTAMP={1000000 + i}\n_BOOT_ID=@BOOT@\n"
                     f"_TRANSPORT=kernel\nSYSLOG_IDENTIFIER=kernel\nPRIORITY=3\nMESSAGE={line}\n\n"
                     for i, line in enumerate(entries))
    ssh(h, f"rm -f {journal}; boot=$(tr -d - < /proc/sys/kernel/random/boot_id); now=$(date +%s%6N); "
           f"sed -e \"s/@NOW@/$now/\" -e \"s/@BOOT@/$boot/\" <<'EOF' | "
           f"/lib/systemd/systemd-journal-remote --split-mode=none --output={journal} - 2>/dev/null\n{export}EOF")


def set_knobs(h: str, gpus: dict | None = None, standin: dict | None = None) -> None:
    if gpus is not None:
        ssh(h, f"cat > {KNOBS_DIR}/gpus.json <<'EOF'\n{json.dumps(gpus)}\nEOF")
        kernel_xids(h, gpus.get("xid") or {})
    if standin is not None:
        ssh(h, f"cat > {KNOBS_DIR}/standin.json <<'EOF'\n{json.dumps(standin)}\nEOF")
