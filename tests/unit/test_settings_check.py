"""Typos in setting names are refused with a did-you-mean (deployer/settings_check.py)."""
from pathlib import Path

import yaml

from deployer.settings_check import known, unknown

ROOT = Path(__file__).resolve().parents[2]


def test_typos_are_named_with_the_closest_setting():
    assert unknown(["deployer_max_modl_len", "preflight_gpu_cont", "watch_budget_second"]) == [
        "deployer_max_modl_len (did you mean deployer_max_model_len?)",
        "preflight_gpu_cont (did you mean preflight_gpu_count?)",
        "watch_budget_second (did you mean watch_budget_seconds or watch_first_budget_seconds?)"]
    assert unknown(["deployer_xyz"]) == ["deployer_xyz (no such setting)"]


def test_settings_of_a_renamed_role_are_refused_with_their_new_name():
    """The roles vllm_install and vllm_patch became install and patch (2026-12): an inventory that still sets
    vllm_install_offline must be told, not silently deployed online (its prefix no longer names a role)."""
    assert unknown(["vllm_install_offline", "vllm_install_index_url", "vllm_patch_x"]) == [
        "vllm_install_index_url (renamed: install_index_url)", "vllm_install_offline (renamed: install_offline)",
        "vllm_patch_x (no such setting)"]


def test_every_documented_setting_and_playbook_switch_is_known():
    """Every setting the README's settings table and the roles' argument specs document is accepted (issue 24 item
    9: this checked known()'s list against itself).  Read here from the files, independently of known()."""
    import re

    import yaml

    from helpers import ROOT
    specs = set()
    for f in (ROOT / "roles").glob("*/meta/argument_specs.yml"):
        specs |= set(yaml.safe_load(f.read_text())["argument_specs"]["main"]["options"])
    assert len(specs) > 60 and "deployer_max_model_len" in specs and "watch_budget_seconds" in specs
    assert not unknown(specs)
    # a setting the README or docs/ name (`name` or `name=value`) exists: a renamed setting leaves no stale doc
    in_docs = set()
    for f in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        in_docs |= set(re.findall(r"`([a-z]+_[a-z0-9_]*[a-z0-9])(?:=[^`]*)?`", f.read_text()))
    assert "deployer_api_key" in in_docs and "balancer_drain_wait_seconds" in in_docs, sorted(in_docs)
    from deployer.host.module_utils import root_causes
    in_docs -= {kind for kind, _rx in root_causes.FATAL}   # failure kinds the docs name (drafter_shape)
    from deployer.host.module_utils import host_state
    in_docs -= set(host_state.METRICS)                       # the state keeper's metrics (docs/monitoring.md)
    assert not unknown(in_docs)
    _names, _prefixes, documented = known()
    assert set(documented) <= specs            # what a did-you-mean suggests is a real, specified setting
    # switches the CLI passes and results the playbooks set are ours too
    assert not unknown(["deployer_serial", "deployer_if_changed", "deployer_rollback_to", "deployer_target",
                        "deployer_result", "deployer_status_live", "deployer_noop_check"])


def test_names_that_are_not_ours_pass():
    assert unknown(["ansible_user", "ansible_python_interpreter", "my_site_var", "inventory_hostname"]) == []


# ---- malformed input: one clear error naming the value and what is allowed, exit 2/3, no host contacted
import subprocess  # noqa: E402
import sys  # noqa: E402

from deployer.events import Collector, Exit  # noqa: E402
from deployer.settings_check import explain_arg_spec_failure, invalid  # noqa: E402


def test_values_of_the_wrong_type_or_outside_the_choices_are_named_with_what_is_allowed():
    """Guards the -e check: Ansible's own validator with the roles' specs, but the message names the value."""
    assert invalid({"deployer_gpu_memory_utilization": "lots", "deployer_port": "http",
                    "deployer_safetensors_load_strategy": "fast", "deployer_max_model_len": 65536,
                    "ansible_user": 3}) == [
        "deployer_gpu_memory_utilization: got 'lots'; expected float",
        "deployer_port: got 'http'; expected int",
        "deployer_safetensors_load_strategy: got 'fast'; expected str; allowed: '', 'lazy', 'eager', 'torchao', "
        "'prefetch'"]
    # converted as Ansible does
    assert invalid({"deployer_gpu_memory_utilization": 0.9, "deployer_port": "8000"}) == []


def test_a_settings_choices_are_the_values_the_engines_argv_builder_takes():
    """`-e deployer_safetensors_load_strategy=prefetch` was refused by a hand-kept choice list although the argv
    builder took it (issue 55): the spec's list is checked against the code that takes the value."""
    from deployer.engines.vllm_argv import LOAD_STRATEGIES
    spec = yaml.safe_load((ROOT / "roles/deployer/meta/argument_specs.yml").read_text())
    opts = spec["argument_specs"]["main"]["options"]
    with_choices = {k: v["choices"] for k, v in opts.items() if "choices" in v}
    assert with_choices == {"deployer_safetensors_load_strategy": ["", *LOAD_STRATEGIES]}
    assert invalid({"deployer_safetensors_load_strategy": "prefetch"}) == []


def test_an_argument_spec_failure_from_the_inventory_is_a_refusal_not_a_failed_deploy():
    """Guards exit 3 (nothing changed) instead of 1 (failed after changes) for a bad inventory value."""
    c = Collector()
    msg = ("Validation of arguments failed:\nargument 'deployer_port' is of type <class 'ansible.module_utils."
           "_internal._datatag._AnsibleTaggedStr'> and we were unable to convert to int: \"'x'\" cannot be converted")
    c({"event": "runner_on_failed", "event_data": {"host": "h1", "task": "Validating arguments against arg spec 'main'",
       "role": "deployer", "res": {"failed": True, "msg": msg, "argument_errors": [msg.splitlines()[1]]}}})
    c({"event": "playbook_on_stats", "event_data": {"processed": {"h1": 1}, "failures": {"h1": 1}}})
    r = c.result(2, "failed")
    assert r.exit_code() == Exit.PREFLIGHT
    assert r.failures[0].msg.startswith("bad setting value (before anything changed): argument 'deployer_port' is of "
                                        "type str and"), r.failures[0].msg
    assert "_datatag" not in explain_arg_spec_failure(msg)


def _up(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "deployer.cli", "up", *args], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)


def test_malformed_inventories_and_extra_var_files_are_bad_input(tmp_path):
    """Guards: Ansible only warns about an inventory it cannot parse and goes on with no hosts; -e files."""
    cases = {
        "broken.yml": ("all:\n  hosts:\n    a: {ansible_host: 1.2.3.4\n", "cannot be read as YAML"),
        "list.yml": ("- h1\n", "expected a mapping of groups"),
    }
    for name, (text, want) in cases.items():
        (tmp_path / name).write_text(text)
        r = _up(tmp_path, "-i", str(tmp_path / name))
        assert r.returncode == 2 and f"inventory {tmp_path / name}: {want}" in " ".join(r.stderr.split()), r.stderr
    (tmp_path / "e.yml").write_text("deployer_port: [8000\n")
    (tmp_path / "l.yml").write_text("- a\n")
    for arg, want in ((f"@{tmp_path}/e.yml", "while parsing a flow sequence"),
                      (f"@{tmp_path}/l.yml", "expected a mapping of variables, got list"),
                      (f"@{tmp_path}/none.yml", "No such file or directory"),
                      ("deployer_port=http", "deployer_port: got 'http'; expected int")):
        r = _up(tmp_path, "--host", "192.0.2.1", "-e", arg)
        assert r.returncode == 2 and want in " ".join(r.stderr.split()), (arg, r.stderr)
    # Ansible's own tags are fine in an inventory: !vault is not a parse error
    (tmp_path / "vault.yml").write_text("all:\n  vars:\n    x: !vault |\n      $ANSIBLE_VAULT;1.1;AES256\n      31\n")
    from deployer.cli.targets import check_inventory_file
    check_inventory_file(tmp_path / "vault.yml")
