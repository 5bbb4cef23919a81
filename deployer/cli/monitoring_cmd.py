"""deployer monitoring: the Prometheus configuration and alert rules for the inventory's GPU hosts
(deployer/monitoring.py renders them; docs/monitoring.md says what they watch)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml

from deployer import monitoring as mon
from deployer.cli.targets import Host, Inventory, Key, Port, Sandbox, Target, User, die
from deployer.events import Exit
from deployer.host.module_utils.host_io import write_atomic
from deployer.output import lit, out

ROLES = Path(__file__).resolve().parents[2] / "roles"


def _plain(value) -> str:
    """A plain str of Ansible's own (tagged) strings, which a YAML writer cannot represent."""
    return str(value).encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")


def _port(value):
    return int(value) if not isinstance(value, bool) and str(value).strip().isdigit() else value


def inventory_hosts(path: str, group: str = mon.TARGET_GROUP) -> list[mon.Host]:
    """The playbooks' GPU hosts (or, with ``group`` balancer, the balancers) as the inventory names them: address,
    port (the engine's; a balancer's HAProxy exporter's), group; a port's default is its role's.  Ansible's own
    inventory reader, group_vars and host_vars included."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager
    loader = DataLoader()
    inv = InventoryManager(loader=loader, sources=[path])
    vm = VariableManager(loader=loader, inventory=inv)
    role, setting = ("balancer", "balancer_metrics_port") if group == mon.BALANCER_GROUP else ("deployer",
                                                                                             "deployer_port")
    default_port = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())[setting]
    hosts = []
    for h in inv.get_hosts(group) if group in inv.groups else []:
        v = vm.get_vars(host=h)
        hosts.append(mon.Host(_plain(h.name), _plain(v.get("ansible_host") or h.name),
                              _port(v.get(setting, default_port)), group if group == mon.BALANCER_GROUP
                              else mon.group_of([_plain(g.name) for g in h.get_groups()])))
    return hosts


def monitoring(out_dir: Annotated[Path, typer.Option(
                   "--out", help="Directory for prometheus.yml, the rules and the dashboard.")],
               host: Host = None, port: Port = 22, user: User = "root", key: Key = None,
               inventory: Inventory = None, sandbox: Sandbox = False,
               scrape_interval_seconds: Annotated[int, typer.Option(
                   "--scrape-interval-seconds", min=1, max=3600, help="How often Prometheus scrapes and evaluates."
               )] = 15) -> None:
    """Write a Prometheus configuration that scrapes the GPU hosts' node_exporter (the deployer's state) and their
    engines' /metrics, the deployer's alert rules and a Grafana dashboard beside it.  Nothing on a host changes."""
    path = Target(host, port, user, key, inventory, sandbox).inventory_path()
    try:
        hosts = inventory_hosts(path)
        if not hosts:
            die(Exit.USAGE, f"{path}: no host in group {mon.TARGET_GROUP!r}")
        balancers = inventory_hosts(path, mon.BALANCER_GROUP)
        files = mon.render(hosts, scrape_interval_seconds, balancers=balancers)
    except mon.BadTarget as e:
        die(Exit.USAGE, f"inventory: {e}")
    if out_dir.exists() and not out_dir.is_dir():
        die(Exit.USAGE, f"--out {out_dir}: exists and is not a directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        write_atomic(str(out_dir / name), text, 0o644)
    out.print(lit(f"wrote {out_dir}"), highlight=False)          # one line each: a long path never widens the next
    out.print(lit(f"prometheus.yml ({len(hosts)} GPU host(s), {len(balancers)} balancer(s)), {mon.RULES_NAME}, "
                  f"{mon.DASHBOARD.name}"), highlight=False)
