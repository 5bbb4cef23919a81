"""The checks task (action plugin deployer_checks): each check keeps its own condition and message, in order.

Plain ansible-playbook against this machine (connection local): nothing reaches a host; every case is a task of one
playbook run.  What the preflight and the smoke stages rely on: the first refusal stops the task and is named (its
message templated only then, a check after it never evaluated), a loop refuses with every failing item's message,
`when` skips, notes are said in order, and a malformed checks list fails before any check runs."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

CASES = {
    "first-refusal": [
        {"name": "any", "that": "gpus | length > 0", "fail_msg": "unused"},
        {"name": "slow", "note": "GPU 6: PCIe link x8 of x16"},
        {"name": "GPU count ({{ want }})", "that": "gpus | length == want",
         "fail_msg": "GPU count: measured {{ gpus | length }}, expected {{ want }}"},
        # never reached: its message would fail to template (an undefined variable)
        {"name": "later", "that": "undefined_var.x", "fail_msg": "{{ undefined_var.y }}"}],
    "loop": [{"name": "MIG", "loop": "{{ mig }}", "index_var": "i", "that": "item != 'Enabled'",
              "fail_msg": "GPU {{ i }}: measured MIG mode {{ item }}; expected Disabled"}],
    "pass": [
        {"name": "skipped", "when": "not sandbox", "that": "false", "fail_msg": "never"},
        {"name": "fits", "that": "free > 1", "fail_msg": "no", "note": "memory plan: {{ free }} GiB free"},
        {"name": "quiet note", "note": "{{ '' }}"},
        {"name": "nccl", "note": "NCCL: no IOMMU in the way"}],
    "empty": [],
    "no-name": [{"that": "true", "fail_msg": "x"}],
    "that-alone": [{"name": "a", "that": "true"}],
    "typo": [{"name": "a", "that": "true", "fail_msg": "x", "fial_msg": "y"}],
}
VARS = {"gpus": list(range(7)), "want": 8, "mig": ["Disabled", "Enabled", "Disabled", "Enabled"], "sandbox": True,
        "free": 12}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("checks")
    tasks = []
    for i, (case, checks) in enumerate(CASES.items()):
        tasks += [{"name": case, "deployer_checks": {"checks": checks}, "register": f"r{i}", "ignore_errors": True},
                  {"name": f"keep {case}", "ansible.builtin.copy": {"content": f"{{{{ r{i} | to_json }}}}",
                                                                    "dest": str(tmp / f"{case}.json"), "mode": "0600"}}]
    pb = tmp / "pb.yml"
    pb.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "vars": VARS, "tasks": tasks}]))
    env = {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp),
           "ANSIBLE_LOCALHOST_WARNING": "False", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False"}
    r = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(pb)],
                       capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    return {case: json.loads((tmp / f"{case}.json").read_text()) for case in CASES}


def test_the_first_refusal_is_named_with_the_notes_before_it_and_nothing_after_it_is_evaluated(results):
    res = results["first-refusal"]
    assert res["failed"] and res["check"] == "GPU count (8)" and res["msg"] == "GPU count: measured 7, expected 8", res
    assert res["notes"] == ["GPU 6: PCIe link x8 of x16"], res      # said before the refusal, kept with it


def test_a_loop_refuses_with_every_failing_item_and_its_index(results):
    res = results["loop"]
    assert res["failed"] and res["msg"] == ["GPU 1: measured MIG mode Enabled; expected Disabled",
                                            "GPU 3: measured MIG mode Enabled; expected Disabled"], res


def test_when_skips_notes_are_said_in_order_and_a_passing_run_refuses_nothing(results):
    res = results["pass"]
    assert not res.get("failed") and res["notes"] == ["memory plan: 12 GiB free", "NCCL: no IOMMU in the way"], res


@pytest.mark.parametrize("case, says", [
    ("empty", "checks: expected a non-empty list of checks"),
    ("no-name", "checks[0]: expected a dict with a name"),
    ("that-alone", "checks[0] (a): that and fail_msg go together"),
    ("typo", "checks[0] (a): unknown keys fial_msg"),
])
def test_a_malformed_checks_list_fails_before_any_check_runs(results, case, says):
    assert results[case]["failed"] and says in results[case]["msg"], results[case]
