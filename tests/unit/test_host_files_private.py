"""What the deployer writes on the host for root alone stays root's: the lock holder (controller machine-id,
boot-id, operator name, run token) and the audit trail are not readable by the service user (issue 40, F11).
Run by Ansible on this machine, as the playbooks run the module."""
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from helpers import ROOT


def run_module(tmp_path, name, args):
    """``ansible localhost -m <name>`` as the playbooks run it: the completed process."""
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
           "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
           "ANSIBLE_LOAD_CALLBACK_PLUGINS": "0"}
    return subprocess.run([str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-o",
                           "-e", f"ansible_python_interpreter={sys.executable}", "-m", name, "-a", json.dumps(args)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def module(tmp_path, name, args):
    r = run_module(tmp_path, name, args)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.split("=>", 1)[1])


def mode(p):
    return stat.S_IMODE(os.stat(p).st_mode)


def test_the_lock_holder_and_the_audit_trail_are_root_s_alone(tmp_path):
    lock, audit = tmp_path / ".lock", tmp_path / "audit.jsonl"
    audit.write_text("")
    os.chmod(audit, 0o644)                   # an audit trail an older deployer left readable
    module(tmp_path, "deploy_lock", {"path": str(lock), "token": "t1",
                                     "owner": {"user": "op", "controller": "c", "machine_id": "m"}})
    assert mode(lock) == 0o700 and mode(lock / "holder.json") == 0o600
    module(tmp_path, "deploy_lock", {"path": str(lock), "token": "t1", "state": "absent",
                                     "audit": {"path": str(audit), "line": {"result": "ok"}}})
    assert mode(audit) == 0o600 and json.loads(audit.read_text())["result"] == "ok"
    audit.unlink()
    module(tmp_path, "deploy_lock", {"path": str(lock), "token": "t2", "state": "absent",
                                     "audit": {"path": str(audit), "line": {"result": "ok"}}})
    assert mode(audit) == 0o600



def test_a_unit_systemd_refuses_is_not_recorded_as_a_release(tmp_path):
    """render's own gate (docs/security.md rule 2, claimed and never exercised): systemd-analyze verify refuses the
    unit, the module fails with systemd's words, and no release.json marks the directory as a release."""
    bad = "[Unit]\nDescription=x\n\n[Service]\nExecStart=/opt/deployer/venvs/missing/bin/python -V\n"
    d = tmp_path / "releases" / "r1"
    args = {"dir": str(d), "files": [{"name": "x.service", "content": bad}], "manifest": {"id": "r1"},
            "unit": "x.service", "live_unit_path": str(tmp_path / "live.service")}
    r = run_module(tmp_path, "release_render", args)
    assert r.returncode != 0 and "systemd-analyze verify refused" in r.stdout, r.stdout + r.stderr
    assert "is not executable" in r.stdout                                # systemd's own reason
    assert not (d / "release.json").exists()
    good = bad.replace("/opt/deployer/venvs/missing/bin/python", "/bin/true")
    args["files"] = [{"name": "x.service", "content": good}]
    module(tmp_path, "release_render", args)
    assert (d / "release.json").exists()


def test_the_audit_line_appended_without_a_module_makes_an_old_0644_trail_private(tmp_path):
    """Issue 53 (F11's residue): the no-op's own append and the lock-free run's raw task appended with umask 077,
    which leaves an existing 0644 audit.jsonl 0644 for ever when only those paths write it."""
    import subprocess

    from deployer.ansible_plugins.filter_plugins.deployer_filters import audit_append
    audit = tmp_path / "audit.jsonl"
    audit.write_text('{"result": "old"}\n')
    os.chmod(audit, 0o644)
    line = json.dumps({"result": "ok", "note": "it's $(x) `y`"})
    subprocess.run(["/bin/sh", "-c", audit_append(line, str(tmp_path) + "/")], check=True)
    assert mode(audit) == 0o600
    assert [json.loads(x)["result"] for x in audit.read_text().splitlines()] == ["old", "ok"]
    assert json.loads(audit.read_text().splitlines()[1])["note"] == "it's $(x) `y`"
