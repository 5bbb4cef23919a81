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
    lbs = inventory_hosts(str(tmp_path / "inv.yml"), "balancer")
    assert lbs == [mon.Host("lb1", "10.0.0.9", 8405, "balancer")]       # its HAProxy exporter (the role's default)
    cfg = yaml.safe_load(mon.render(hosts, balancers=lbs)["prometheus.yml"])
    jobs = {j["job_name"]: j["static_configs"] for j in cfg["scrape_configs"]}
    assert jobs["deployer-hosts"] == [{"targets": ["10.0.0.21:9100"], "labels": {"group": "west", "host": "g1"}},
                                      {"targets": ["[fd00::22]:9100"], "labels": {"group": "west", "host": "g2"}},
                                      {"targets": ["gpu3.example.com:9100"], "labels": {"group": "east", "host": "g3"}}]
    assert [c["targets"] for c in jobs["deployer-engines"]] == [["10.0.0.21:8000"], ["[fd00::22]:8001"],
                                                                ["gpu3.example.com:8000"]]
    assert jobs["deployer-balancers"] == [{"targets": ["10.0.0.9:8405"],
                                           "labels": {"group": "balancer", "host": "lb1"}}]
    assert cfg["rule_files"] == ["deployer-alerts.yml"]
    # a balancer without an exporter (balancer_metrics_port 0) is no target
    cfg = yaml.safe_load(mon.render(hosts, balancers=[mon.Host("lb1", "10.0.0.9", 0, "balancer")])["prometheus.yml"])
    assert "deployer-balancers" not in {j["job_name"] for j in cfg["scrape_configs"]}


def test_the_dashboards_queries_are_promql_that_promtool_parses_and_name_only_metrics_that_exist(tmp_path):
    """Each panel's query, as a recording rule, under promtool check rules (Prometheus' own parser); the deployer's
    metric names are the keeper's (host_state.METRICS), the engines' are vLLM's and SGLang's (read in their
    sources: vllm/v1/metrics/loggers.py, sglang/srt/observability/metrics_collector.py)."""
    import json
    import re

    from deployer.host.module_utils.host_state import METRICS
    dash = json.loads(mon.DASHBOARD.read_text())
    queries = mon.dashboard_queries(dash, "10.0.0.21")
    assert len(queries) >= 14 and all(p.get("datasource") for p in dash["panels"] if p["type"] != "row")
    names = set(re.findall(r"\b((?:deployer|vllm|sglang)[a-z_:]*)", " ".join(q for _, q in queries)))
    engines = {"vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket", "vllm:kv_cache_usage_perc",
               "vllm:num_requests_running", "vllm:spec_decode_num_accepted_tokens_total",
               "vllm:spec_decode_num_draft_tokens_total", "sglang:generation_tokens_total",
               "sglang:time_to_first_token_seconds_bucket", "sglang:token_usage", "sglang:num_running_reqs",
               "sglang:spec_accept_rate"}
    assert names - set(METRICS) - engines == set(), names - set(METRICS) - engines
    if PROMTOOL:
        rules = {"groups": [{"name": "dashboard", "rules": [{"record": "panel_%d" % i, "expr": q}
                                                           for i, (_, q) in enumerate(queries)]}]}
        (tmp_path / "r.yml").write_text(yaml.safe_dump(rules))
        r = subprocess.run([PROMTOOL, "check", "rules", str(tmp_path / "r.yml")], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("address,port,group", [
    ("10.0.0.1\n  - job_name: x", 8000, "gpu"), ("a b", 8000, "gpu"), ("10.0.0.1:9999", 8000, "gpu"),
    ("10.0.0.1", 0, "gpu"), ("10.0.0.1", True, "gpu"), ("10.0.0.1", "8000", "gpu"), ("10.0.0.1", 8000, "g\"x"),
    ("10.0.0.1", 70000, "gpu"),
])
def test_a_value_that_is_not_one_target_is_refused_with_the_host_and_the_value(address, port, group):
    with pytest.raises(mon.BadTarget) as e:
        mon.render([mon.Host("g1", address, port, group)])
    assert str(e.value).startswith("g1: ")
    with pytest.raises(mon.BadTarget, match="inventory name 'g1\\\\n'"):
        mon.render([mon.Host("g1\n", "10.0.0.1", 8000, "gpu")])


@needs_promtool
def test_promtool_accepts_the_configuration_and_its_rules(tmp_path):
    for name, text in mon.render([mon.Host("g1", "10.0.0.21", 8000, "gpu")], 5).items():
        (tmp_path / name).write_text(text)
    r = subprocess.run([PROMTOOL, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True)
    assert r.returncode == 0 and "SUCCESS: 7 rules found" in r.stdout, r.stdout + r.stderr
