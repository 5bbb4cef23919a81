"""`deployer monitoring`: the Prometheus configuration for the inventory's GPU hosts, read by Ansible's own
inventory reader and checked by Prometheus' own promtool (deployer/monitoring.py, cli/monitoring_cmd.py)."""
import subprocess

import pytest
import yaml
from test_host_state import PROMTOOL, needs_promtool

from deployer import monitoring as mon
from deployer.cli.monitoring_cmd import inventory_hosts

INVENTORY = """
all:
  children:
    gpu:
      children:
        west: {hosts: {g1: {ansible_host: 10.0.0.21}, g2: {ansible_host: "fd00::22", deployer_port: 8001}}}
        east: {hosts: {g3: {ansible_host: gpu3.example.com}}}
    balancer:
      hosts: {lb1: {ansible_host: 10.0.0.9}}
"""


def test_the_inventorys_gpu_hosts_become_node_exporter_and_engine_targets_by_group(tmp_path):
    (tmp_path / "inv.yml").write_text(INVENTORY)
    hosts = inventory_hosts(str(tmp_path / "inv.yml"))
    assert sorted(hosts, key=lambda h: h.name) == [mon.Host("g1", "10.0.0.21", 8000, "west"),
                                                  mon.Host("g2", "fd00::22", 8001, "west"),
                                                  mon.Host("g3", "gpu3.example.com", 8000, "east")]
    cfg = yaml.safe_load(mon.render(hosts)["prometheus.yml"])
    jobs = {j["job_name"]: j["static_configs"] for j in cfg["scrape_configs"]}
    assert jobs["deployer-hosts"] == [{"targets": ["gpu3.example.com:9100"], "labels": {"group": "east"}},
                                      {"targets": ["10.0.0.21:9100", "[fd00::22]:9100"], "labels": {"group": "west"}}]
    assert jobs["deployer-engines"][1]["targets"] == ["10.0.0.21:8000", "[fd00::22]:8001"]
    assert cfg["rule_files"] == ["deployer-alerts.yml"]          # the balancer is no GPU host: not a target


@pytest.mark.parametrize("address,port,group", [
    ("10.0.0.1\n  - job_name: x", 8000, "gpu"), ("a b", 8000, "gpu"), ("10.0.0.1:9999", 8000, "gpu"),
    ("10.0.0.1", 0, "gpu"), ("10.0.0.1", True, "gpu"), ("10.0.0.1", "8000", "gpu"), ("10.0.0.1", 8000, "g\"x"),
])
def test_a_value_that_is_not_one_target_is_refused_with_the_host_and_the_value(address, port, group):
    with pytest.raises(mon.BadTarget) as e:
        mon.render([mon.Host("g1", address, port, group)])
    assert str(e.value).startswith("g1: ")


@needs_promtool
def test_promtool_accepts_the_configuration_and_its_rules(tmp_path):
    for name, text in mon.render([mon.Host("g1", "10.0.0.21", 8000, "gpu")], 5).items():
        (tmp_path / name).write_text(text)
    r = subprocess.run([PROMTOOL, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True)
    assert r.returncode == 0 and "SUCCESS: 7 rules found" in r.stdout, r.stdout + r.stderr
