"""The no-op task's arguments (action plugin deployer_noop_check) are checked against its documented options.

Its argument spec is read from the module's DOCUMENTATION (one definition): an unknown argument or one of the wrong
type fails the task before anything is planned or read, and says which; a well-formed call with an unknown setting
name returns no plan and no verdict (the full deploy's preflight refuses the name).  Plain ansible-playbook against
this machine (connection local): nothing reaches a host."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def play(tmp_path, args):
    pb = tmp_path / "pb.yml"
    pb.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"name": "noop check", "deployer_noop_check": args, "register": "r"},
        {"name": "keep", "ansible.builtin.copy": {"content": "{{ r | to_json }}", "dest": str(tmp_path / "r.json"),
                                                  "mode": "0600"}}]}]))
    env = {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path),
           "ANSIBLE_LOCALHOST_WARNING": "False", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False"}
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(pb)],
                          capture_output=True, text=True, env=env, cwd=ROOT)


GOOD = {"settings": {"root": "/opt/deployer"}, "root": "/opt/deployer", "service": "deployer-engine",
        "templates_dir": str(ROOT / "templates")}


@pytest.mark.parametrize("bad, says", [
    ({"rooot": "/opt/deployer"}, "Unsupported parameters for (deployer_noop_check) module: rooot"),
    ({"settings": "root /opt/deployer"}, "settings"),   # a dict option parses JSON or k=v text, nothing else
    ({"settings_unknown": {"a": 1}}, "settings_unknown"),
    ({"service": None}, "missing required arguments: service"),
    # a name that goes into a template the plugin evaluates: a name, never an expression
    ({"result_from": "lookup('pipe', 'id')"}, "result_from: got \"lookup('pipe', 'id')\", expected a variable name"),
    ({"audit_line_from": "x | default(y)"}, "audit_line_from: got 'x | default(y)', expected a variable name"),
], ids=["unknown", "settings-not-a-dict", "list-not-a-dict", "required", "result-from-expression",
        "audit-line-from-filter"])
def test_a_bad_argument_fails_the_task_and_says_which(tmp_path, bad, says):
    args = {k: v for k, v in {**GOOD, **bad}.items() if v is not None}
    r = play(tmp_path, args)
    assert r.returncode == 2 and not (tmp_path / "r.json").exists(), r.stdout + r.stderr
    assert says in r.stdout, r.stdout


def test_an_unknown_setting_name_gives_no_plan_and_reads_nothing(tmp_path):
    r = play(tmp_path, {**GOOD, "settings_unknown": ["deployer_max_modl_len (did you mean ...?)"],
                        "result_from": "deployer_run_result", "audit_line_from": "deployer_audit_line"})
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["noop"] is False and res["plan"] is None and res["reasons"] is None, res
    assert "ansible_facts" not in res, res
