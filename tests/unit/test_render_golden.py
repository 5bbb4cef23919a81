"""Golden files: the systemd unit and env file the render role writes, rendered by Ansible itself (local run)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from deployer.plan import make_plan
from helpers import ROOT

GOLDEN = ROOT / "tests" / "golden"


def settings(**over):
    """roles/deployer/defaults/main.yml as make_plan's settings (the deployer_ prefix dropped)."""
    d = yaml.safe_load((ROOT / "roles/deployer/defaults/main.yml").read_text())
    s = {k[len("deployer_"):]: v for k, v in d.items()}
    s.update(root=d["deployer_root"], extra_args=["--root-path", "/a b'\";$(x) %n $HOME"],
             patch_engine_id="0e0e0e0e",                      # the golden file must not change with the engine
             device_allow=["char-nvidia-frontend rw", "char-nvidia-uvm rw"],   # what preflight reads on a GPU host
             allow_unauthenticated=not over.get("api_key"))
    s.update(over)
    return s


def render(tmp_path, **extra):
    drafter = {"src": "/home/op/drafter", "files": [], "tree_sha256": "0123456789abcdef" * 4, "bytes": 0}
    plan = make_plan(settings(**{k[len("deployer_"):]: v for k, v in extra.items()}), drafter)
    assert plan["api_protected"] == bool(extra.get("deployer_api_key"))
    return render_plan(tmp_path, plan, **extra)


def render_plan(tmp_path, plan, **extra):
    """The render role's unit and env file templates for ``plan``, rendered by Ansible itself (a local run)."""
    vars_ = dict(render_plan=plan, render_patch={"fingerprint": "f00", "patches": ["P1", "P2", "P3", "P4", "P5"]},
                 __render_id="r0123456789a", __render_dir="/opt/deployer/releases/r0123456789a",
                 deployer_api_key=extra.get("deployer_api_key", ""),
                 deployer_hf_token=extra.get("deployer_hf_token", ""),
                 ansible_managed="Managed by deployer; local edits are overwritten.")
    (tmp_path / "vars.json").write_text(json.dumps(vars_))
    pb = [{"hosts": "localhost", "gather_facts": False, "connection": "local", "tasks": [
        # as roles/render does: the template lookup on this controller, its text handed to the host's release_render
        {"ansible.builtin.copy": {"content": "{{ lookup('ansible.builtin.template', '%s') }}"
                                             % (ROOT / f"templates/{t}.j2"), "dest": str(tmp_path / t)}}
        for t in ("engine.service", "engine.env")]}]
    (tmp_path / "pb.yml").write_text(yaml.safe_dump(pb))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False")
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,",
                        "-e", f"@{tmp_path / 'vars.json'}", str(tmp_path / "pb.yml")],
                       capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    return (tmp_path / "engine.service").read_text(), (tmp_path / "engine.env").read_text()


def check(name, text):
    path = GOLDEN / name
    if os.environ.get("DEPLOYER_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from the golden file (DEPLOYER_UPDATE_GOLDEN=1 to accept)"


def test_unit_and_env_golden(tmp_path):
    unit, env = render(tmp_path)
    check("deployer-engine.service", unit)
    check("vllm.env", env)


def test_secrets_in_no_release_file_but_the_live_ones(tmp_path):
    # guards (issue 20, item 8): a release's files held its secrets, so a rollback put a revoked key back in
    # service; now no release file holds one, and the live files (start stage) hold them, quoted for their formats
    from deployer.host.module_utils import envfile
    from deployer.live_secrets import secret_files
    unit, env = render(tmp_path, deployer_api_key='k"e$y`1\\', deployer_hf_token="hf_abc")
    for text in (unit, env):
        assert "k\"e" not in text and "hf_abc" not in text and "VLLM_API_KEY" not in text and "HF_TOKEN" not in text
    assert "EnvironmentFile=/opt/deployer/releases/r0123456789a/vllm.env\n" in unit
    live = secret_files('k"e$y`1\\', "hf_abc")
    assert envfile.parse(live["server.env"]) == {"VLLM_API_KEY": 'k"e$y`1\\', "HF_TOKEN": "hf_abc"}
    assert 'api-key: "k\\"e$y`1\\\\"' in live["sglang-secrets.yaml"]
    assert secret_files("", "") == {"server.env": "# Managed by deployer.  Mode 0600: the live secrets "
                                                  "(docs/security.md).\n",
                                    "sglang-secrets.yaml": "# Managed by deployer.  Mode 0600: SGLang's API key "
                                                           "(merged with --config).\n{}\n"}


def test_a_release_id_does_not_depend_on_its_secrets():
    from deployer.identity import release_id
    from deployer.plan import make_plan
    drafter = {"src": "/d", "files": [], "tree_sha256": "ab" * 32, "bytes": 0}
    a = make_plan(settings(api_key="old", hf_token="t1", allow_unauthenticated=False), drafter)
    b = make_plan(settings(api_key="rotated", hf_token="t2", allow_unauthenticated=False), drafter)
    assert release_id(a, "fp") == release_id(b, "fp")
    assert "old" not in str(a["release_inputs"]) and "rotated" not in str(b["release_inputs"])


def test_the_golden_unit_s_hardening_score_is_what_docs_hardening_md_says(tmp_path):
    """docs/hardening.md: 9.6 -> 1.9 by systemd's own offline score of the golden unit (claimed, never exercised:
    the test audit of issue 40).  A directive dropped from the template raises it."""
    import re
    import shutil
    import subprocess

    from deployer import tools
    unit = tmp_path / "deployer-engine.service"
    shutil.copy(ROOT / "tests" / "golden" / "deployer-engine.service", unit)
    def exposure(path):
        r = subprocess.run([tools.system("systemd-analyze"), "security", "--offline=true", str(path)],
                           capture_output=True, text=True)
        return float(re.search(r"Overall exposure level for \S+: ([\d.]+)", r.stdout).group(1)), r.stdout
    score, r_out = exposure(unit)
    assert score <= 2.0, r_out[-2000:]
    weaker = tmp_path / "weaker" / "deployer-engine.service"
    weaker.parent.mkdir()
    weaker.write_text(unit.read_text().replace("CapabilityBoundingSet=\n", "").replace("PrivateTmp=yes\n", ""))
    assert exposure(weaker)[0] > score
