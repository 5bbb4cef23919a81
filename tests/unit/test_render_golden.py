"""Golden files: the systemd unit and env file the render role writes, rendered by Ansible itself (local run)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from deployer.serve import build_serve_argv
from helpers import ROOT

GOLDEN = ROOT / "tests" / "golden"
ARGV = build_serve_argv(dict(
    launcher=["/opt/deployer/venvs/vllm-0.16.0/bin/vllm"], model="/srv/models/Kimi-K2.5",
    served_model_name="kimi-k2.5", port=8000, tensor_parallel_size=8, gpu_memory_utilization=0.9,
    max_model_len=131072, speculative={"method": "eagle3", "model": "/opt/deployer/drafters/0123456789abcdef",
                                       "num_speculative_tokens": 3},
    extra_args=["--root-path", "/a b'\";$(x) %n $HOME"]))


def render(tmp_path, **extra):
    dflt = {}
    for role in ("render", "start"):
        dflt.update(yaml.safe_load((ROOT / f"roles/{role}/defaults/main.yml").read_text()))
    vars_ = dict(dflt, _deployer_release_id="r0123456789a", deployer_vllm_version="0.16.0",
                 _deployer_patch_ids=["P1", "P2", "P3", "P4", "P5"], deployer_served_model_name="kimi-k2.5",
                 _deployer_release_dir="/opt/deployer/releases/r0123456789a", _deployer_argv=ARGV,
                 ansible_managed="Managed by deployer; local edits are overwritten.", **extra)
    (tmp_path / "vars.json").write_text(json.dumps(vars_))
    pb = [{"hosts": "localhost", "gather_facts": False, "connection": "local", "tasks": [
        {"ansible.builtin.template": {"src": str(ROOT / f"templates/{t}.j2"), "dest": str(tmp_path / t)}}
        for t in ("vllm.service", "vllm.env")]}]
    (tmp_path / "pb.yml").write_text(yaml.safe_dump(pb))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False")
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,",
                        "-e", f"@{tmp_path / 'vars.json'}", str(tmp_path / "pb.yml")],
                       capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    return (tmp_path / "vllm.service").read_text(), (tmp_path / "vllm.env").read_text()


def check(name, text):
    path = GOLDEN / name
    if os.environ.get("DEPLOYER_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from the golden file (DEPLOYER_UPDATE_GOLDEN=1 to accept)"


def test_unit_and_env_golden(tmp_path):
    unit, env = render(tmp_path)
    check("deployer-vllm.service", unit)
    check("vllm.env", env)


def test_secrets_only_in_env_file(tmp_path):
    unit, env = render(tmp_path, render_api_key='k"e$y`1\\', render_hf_token="hf_abc")
    assert 'VLLM_API_KEY="k\\"e\\$y\\`1\\\\"' in env and 'HF_TOKEN="hf_abc"' in env
    assert "k\"e" not in unit and "hf_abc" not in unit
