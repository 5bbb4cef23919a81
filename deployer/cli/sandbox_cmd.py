"""deployer sandbox start|stop|status|reboot: the embedded sandbox GPU hosts (deployer/sandbox/)."""
from __future__ import annotations

import time
from typing import Annotated, Optional

import typer

from deployer.cli.targets import die
from deployer.events import Exit
from deployer.output import out

app = typer.Typer(no_args_is_help=True, help="The embedded sandbox GPU host (real sshd + systemd, simulated GPUs).")


@app.command("start")
def start(hosts: Annotated[int, typer.Option("--hosts", "-n", min=1, max=20, help="How many sandbox hosts.")] = 1,
          balancer: Annotated[bool, typer.Option("--balancer", help="One more host running HAProxy in front of "
                                                  "them (inventory group balancer).")] = False,
          sudo: Annotated[bool, typer.Option("--sudo", help="Hosts that refuse root over SSH: the deployer logs in "
                                              "as 'deploy' and becomes root with sudo.")] = False,
          real_engine: Annotated[bool, typer.Option(
              "--real-engine", help="Hosts that serve the real vLLM (its CPU build, ~6 GB in the controller's package "
                                    "cache) and a tiny real Kimi-K2.5 instead of the stand-in (docs/real-engine.md).")
          ] = False):
    """Start N sandbox hosts (sbx1..sbxN) and write their inventory."""
    from deployer.sandbox import hosts as sb
    t0 = time.time()
    try:
        started = sb.start(hosts, balancer=balancer, sudo=sudo, real_engine=real_engine)
    except sb.SandboxError as e:
        die(Exit.FAILED, str(e))
    for h in started:
        out.print(f"{h.name} {h.ip} up (ssh -F {sb.STATE}/ssh_config {h.name})")
    out.print(f"inventory: {sb.STATE}/inventory.yml  ({time.time() - t0:.1f} s)")


@app.command("stop")
def stop(name: Annotated[Optional[list[str]], typer.Argument(help="Hosts to stop (default: all).")] = None):
    """Stop sandbox hosts and delete their state."""
    from deployer.sandbox import hosts as sb
    out.print("stopped: " + (", ".join(sb.stop(name or None)) or "nothing"))


@app.command("reboot")
def reboot(name: Annotated[str, typer.Argument(help="The host to reboot (e.g. sbx1).")],
           hard: Annotated[bool, typer.Option("--hard", help="A power cut: kill the machine, stop nothing.")] = False):
    """Reboot a sandbox host on its own disk (rehearse a reboot of the GPU box: the server must come back)."""
    from deployer.sandbox import hosts as sb
    try:
        took = sb.reboot(name, hard=hard)
    except sb.SandboxError as e:
        die(Exit.FAILED, str(e))
    out.print(f"{name} rebooted ({'power cut' if hard else 'orderly'}); ssh answers after {took:.1f} s")


@app.command("status")
def status():
    """Which sandbox hosts run."""
    from deployer.sandbox import hosts as sb
    for s in sb.status():
        out.print(f"{s['name']} {s['ip']} {'running' if s['running'] else 'stopped'}")
