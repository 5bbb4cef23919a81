"""deployer: deploy and operate vLLM + EAGLE-3 (Kimi-K2.5) on GPU hosts.  The CLI orchestrates; Ansible acts.

Commands by group: deploy.py (up, rollback, watch, unlock), views.py (releases, status, logs),
schedule_cmd.py, sandbox_cmd.py, patch_cmd.py, versions_cmd.py (versions), monitoring_cmd.py (monitoring); where a
command acts: targets.py; what it prints: deployer/output.py.
"""
from __future__ import annotations

import typer

from deployer.cli import deploy, monitoring_cmd, patch_cmd, sandbox_cmd, schedule_cmd, versions_cmd, views

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n")[0])
for _fn in (deploy.up, deploy.rollback, views.releases, views.status, deploy.watch, views.logs, deploy.unlock,
            versions_cmd.versions, monitoring_cmd.monitoring):
    app.command()(_fn)
app.add_typer(sandbox_cmd.app, name="sandbox")
app.add_typer(patch_cmd.app, name="patch")
app.add_typer(schedule_cmd.app, name="schedule")


def main() -> None:
    app()
