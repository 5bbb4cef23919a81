"""Typos in setting names are refused with a did-you-mean (deployer/settings_check.py)."""
from deployer.settings_check import known, unknown


def test_typos_are_named_with_the_closest_setting():
    assert unknown(["deployer_max_modl_len", "preflight_gpu_cont", "watch_budget_second"]) == [
        "deployer_max_modl_len (did you mean deployer_max_model_len?)",
        "preflight_gpu_cont (did you mean preflight_gpu_count?)",
        "watch_budget_second (did you mean watch_budget_seconds?)"]
    assert unknown(["deployer_xyz"]) == ["deployer_xyz (no such setting)"]


def test_every_documented_setting_and_playbook_switch_is_known():
    names, _prefixes, documented = known()
    assert not unknown(documented)
    # switches the CLI passes and results the playbooks set are ours too
    assert not unknown(["deployer_serial", "deployer_if_changed", "deployer_rollback_to", "deployer_target",
                        "deployer_result", "deployer_status_live", "deployer_noop_check"])


def test_names_that_are_not_ours_pass():
    assert unknown(["ansible_user", "ansible_python_interpreter", "my_site_var", "inventory_hostname"]) == []
