"""What Prometheus needs to watch the inventory's GPU hosts (`deployer monitoring`): a scrape configuration naming
each host's node_exporter (the state keeper's textfile, docs/monitoring.md) and each engine's own ``/metrics``, and
the project's alert rules and Grafana dashboard beside it.  Pure: the hosts come in as data (cli/monitoring_cmd.py
reads the inventory), the files go out as text; nothing here touches a host."""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

RULES = Path(__file__).resolve().parent.parent / "templates" / "prometheus" / "deployer-alerts.yml"
RULES_NAME = "deployer-alerts.yml"
DASHBOARD = RULES.parent.parent / "grafana" / "deployer-dashboard.json"
# The playbooks' hosts (playbooks/up.yml: deployer_target, default gpu) and groups that say nothing of a host's role
TARGET_GROUP = "gpu"
BALANCER_GROUP = "balancer"        # playbooks/up.yml's HAProxy hosts
PLAIN_GROUPS = {"all", "ungrouped", TARGET_GROUP}
NODE_EXPORTER_PORT = 9100          # Debian's prometheus-node-exporter listens here
# a DNS name (RFC 1123 labels) or an IP address: what may stand in a target's host part
_NAME = re.compile(r"(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}"
                   r"[A-Za-z0-9])?)*\.?")
_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,127}")
_HOST_LABEL = re.compile(r"[A-Za-z0-9_.:\[\]-]{1,253}")   # an inventory name as the balancer names its server


class BadTarget(ValueError):
    """An inventory value that cannot be a Prometheus target; the message names the host and the value."""


@dataclass(frozen=True)
class Host:
    name: str          # the inventory's name
    address: str       # ansible_host, or the name
    port: int          # deployer_port: the engine's
    group: str         # the release-drift alert's group label


def target(address: str, port: int) -> str:
    """``address:port`` as Prometheus' static_configs take it (an IPv6 address in brackets)."""
    try:
        ip = ipaddress.ip_address(address)
        return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
    except ValueError:
        return f"{address}:{port}"


def check(h: Host) -> None:
    """Refuse what would not be one target: a value from the inventory is data, never YAML or a second target."""
    try:
        ipaddress.ip_address(h.address)
    except ValueError:
        if not _NAME.fullmatch(h.address):
            raise BadTarget(f"{h.name}: address {h.address!r} is neither an IP address nor a DNS name") from None
    if isinstance(h.port, bool) or not isinstance(h.port, int) or not 0 < h.port < 65536:
        raise BadTarget(f"{h.name}: port {h.port!r} (deployer_port, or a balancer's balancer_metrics_port): expected a "
                        "port number, 1 to 65535")
    if not _LABEL.fullmatch(h.group):
        raise BadTarget(f"{h.name}: group {h.group!r}: expected a label value of letters, digits, _ . -")
    if not _HOST_LABEL.fullmatch(h.name):
        raise BadTarget(f"inventory name {h.name!r}: expected letters, digits, _ . : - (the balancer's server name)")


def group_of(groups: list[str]) -> str:
    """The group a host's release is compared within: its first group of its own, else the playbooks' group."""
    own = sorted(g for g in groups if g not in PLAIN_GROUPS)
    return own[0] if own else TARGET_GROUP


def prometheus_config(hosts: list[Host], scrape_interval_seconds: int = 15,
                      node_exporter_port: int = NODE_EXPORTER_PORT, balancers: list[Host] = ()) -> dict:
    """A whole Prometheus configuration: the rules file beside it, the hosts' node_exporters and the engines, each
    target labelled with its group and its inventory name (``host``: the alert rules match it with the balancer's
    server of that name), and the balancers' HAProxy exporters (``Host.port``: balancer_metrics_port; 0: none).
    An operator with a Prometheus of their own copies the scrape jobs."""
    lbs = sorted((b for b in balancers if b.port != 0), key=lambda x: x.name)     # port 0: no exporter
    for h in [*hosts, *lbs]:
        check(h)
    gpu = sorted(hosts, key=lambda x: x.name)

    def job(name, members, port_of):
        return {"job_name": name, "static_configs": [
            {"targets": [target(h.address, port_of(h))], "labels": {"group": h.group, "host": h.name}}
            for h in members]}
    interval = f"{int(scrape_interval_seconds)}s"
    jobs = [job("deployer-hosts", gpu, lambda h: node_exporter_port), job("deployer-engines", gpu, lambda h: h.port)]
    if lbs:
        jobs.append(job("deployer-balancers", lbs, lambda h: h.port))
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [RULES_NAME], "scrape_configs": jobs}


def render(hosts: list[Host], scrape_interval_seconds: int = 15,
           node_exporter_port: int = NODE_EXPORTER_PORT, balancers: list[Host] = ()) -> dict[str, str]:
    """File name -> text: ``prometheus.yml``, the alert rules and the Grafana dashboard (import it; its
    ``datasource`` variable picks the Prometheus)."""
    head = ("# Written by `deployer monitoring` from the inventory's GPU hosts (docs/monitoring.md).  The rules file\n"
            "# is the project's templates/prometheus/deployer-alerts.yml.\n")
    cfg = prometheus_config(hosts, scrape_interval_seconds, node_exporter_port, balancers)
    return {"prometheus.yml": head + yaml.safe_dump(cfg, sort_keys=False), RULES_NAME: RULES.read_text(),
            DASHBOARD.name: DASHBOARD.read_text()}


def dashboard_queries(dashboard: dict, host: str = ".*") -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of the dashboard, its ``$host`` variable set to ``host``."""
    return [(p["title"], t["expr"].replace("$host", host)) for p in dashboard["panels"] if p["type"] != "row"
            for t in p["targets"]]
