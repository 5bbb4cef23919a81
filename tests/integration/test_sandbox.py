"""The whole deploy against a real sandbox host: real sshd, real systemd, real Ansible, real vLLM in the venv."""
import json
import os
import re

import pytest

from sandbox_helpers import FAST, SVC, deployer, flat, needs_sandbox, sandbox_hosts, up, venv
from sandbox_helpers import main_pid as _main_pid
from sandbox_helpers import sh as _sh

pytestmark = [pytest.mark.sandbox, needs_sandbox]
from deployer.sandbox import hosts as sbx  # noqa: E402
from deployer.sandbox.common import MODEL_DIR, STANDIN_PATH  # noqa: E402

H = "sbx1"


@pytest.fixture(scope="module", autouse=True)
def sandbox():
    yield from sandbox_hosts(1, seed=False, engines=("vllm-0.18.0",))   # the whole cold deploy is the point here


def sh(cmd):
    return _sh(H, cmd)


def main_pid():
    return _main_pid(H)


def host_state():
    """Everything a failed preflight must leave untouched (the audit log records the attempt; the lock is transient)."""
    return sh("(find /opt/deployer -mindepth 1 \\( -path /opt/deployer/cache -o -path /opt/deployer/.lock "
              "-o -name audit.jsonl \\) -prune -o -printf '%p %s %T@\\n' 2>/dev/null | sort; "
              f"cat /etc/systemd/system/{SVC}.service 2>/dev/null; systemctl show -p MainPID -p ActiveState {SVC}) "
              "| sha256sum")


def traced_up(tmp_path, name):
    """``up`` with DEPLOYER_TRACE_FILE; the plan lines its filters wrote (deployer_filters._trace)."""
    trace = tmp_path / f"{name}.jsonl"
    r = up(env=dict(os.environ, DEPLOYER_TRACE_FILE=str(trace)))
    lines = [json.loads(x) for x in trace.read_text().splitlines()] if trace.exists() else []
    return r, [x["plan"] for x in lines if "plan" in x]


def test_01_full_up_then_noop(tmp_path):
    # the run's plan is made once and the drafter hashed once, in a full deploy and in a no-op alike (issue 22:
    # the no-op check made it twice and preflight a third time, each hashing the drafter)
    r, plans = traced_up(tmp_path, "cold")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(plans) == ["drafter hashed", "made"], plans
    assert "deployed" in r.stdout and "EAGLE-3 acceptance rate 0." in r.stdout
    assert "patched vLLM 0.16.0: P1, P2, P3, P4, P5" in r.stderr
    assert "supports_eagle3(KimiK25ForConditionalGeneration) = True" in sh(f"journalctl -u {SVC} --no-pager")
    cur = sh("readlink /opt/deployer/current")
    argv = json.loads(sh("cat /opt/deployer/current/argv.json"))
    assert argv[:3] == [f"{venv()}/bin/python", STANDIN_PATH, "serve"]
    assert json.loads(sh("cat /run/deployer-standin/argv.json"))["argv"] == argv[2:]
    assert sh("stat -c %a " + cur + "/vllm.env") == "600"
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["method"] == "eagle3" and spec["model"].startswith("/opt/deployer/drafters/")
    assert sh(f"test -f {spec['model']}/.deployer-complete && echo ok") == "ok"
    # issue 42: the default deploy passes its own memory plan, and releases records it beside what the engine said
    assert "memory plan per GPU: 97887 MiB x gpu_memory_utilization 0.94 = 89.9 GiB; weights 71.8 GiB" in flat(r.stderr)
    # the release's Kimi kernels are PTX only on sm_120: the verify stage says which, read off the installed wheel
    assert re.search(r"PTX only, compiled by the driver at the first load .*vllm/_moe_C\.abi3\.so \(fused MoE, "
                     r"Kimi's INT4 Marlin MoE among them\): 15 of 33 CUDA units", flat(r.stderr)), r.stderr[-3000:]
    live = json.loads(deployer("releases", "--sandbox", "--json").stdout)[H]["releases"][0]
    assert live["kv_cache_tokens_planned"] == 181_864 and live["kv_cache_tokens"] > 0, live
    assert live["tokens_per_second"] > 0, live
    pid = main_pid()

    r2, plans = traced_up(tmp_path, "noop")
    assert r2.returncode == 0, r2.stdout + r2.stderr
    assert "unchanged, nothing restarted" in r2.stdout
    assert sorted(plans) == ["drafter hashed", "made"], plans
    assert main_pid() == pid and sh("readlink /opt/deployer/current") == cur
    assert sh("ls /opt/deployer/releases | wc -l") == "1"


def test_02_hostile_value_reaches_server_intact_and_runs_nothing():
    evil = "/a b'\";$(touch /tmp/pwned)`touch /tmp/pwned2` %n $HOME \\x"
    r = up("-e", "deployer_extra_args=" + json.dumps(["--root-path", evil]))
    assert r.returncode == 0, r.stdout + r.stderr
    # systemd runs no shell, so nothing can be "executed"; what can break is systemd's own expansion of
    # $VAR and %-specifiers and its word splitting: the server must receive the value byte for byte
    got = json.loads(sh("cat /run/deployer-standin/argv.json"))["argv"]
    assert got[got.index("--root-path") + 1] == evil


PREFLIGHT_CASES = {
    "seven_gpus": "GPU count: measured 7, expected 8",
    "missing_shard": "model shards: measured 63 of 64 present",
    "no_disk": "GiB, expected >= 1000",   # venv (if missing) + drafter + the 100000 GiB margin
    "no_driver": "nvidia-smi: measured rc=9 (NVIDIA-SMI has failed because it couldn't communicate with the "
                 "NVIDIA driver.",
    "old_driver": "NVIDIA driver: measured 550.54.15, expected >= 570.0",
    "mig_enabled": "GPU 2: measured MIG mode Enabled; expected Disabled",
    "wrong_gpu": "GPU 0: measured 'NVIDIA H100 80GB HBM3' with 81559 MiB; expected a name matching "
                 "'RTX PRO 6000 Blackwell' with >= 97000 MiB",
    "missing_config": "model: /srv/models/Kimi-K2.5/config.json not found",
    "bad_drafter": "drafter: /nonexistent/drafter/config.json not found",
    # a partial download: found from the shard's own header in seconds, not by the engine after minutes
    "truncated_shard": "model shards: 1 of 64 in /srv/models/Kimi-K2.5 do not match their own safetensors header: "
                       "model-00023-of-000064.safetensors measured 0 bytes, expected a safetensors file (shorter than "
                       "a safetensors header (8 bytes))",
    # issue 24: a shard root can read and the service user cannot: found before the load, not by the engine in it
    "unreadable_shard": "model files: measured 1 not readable by user vllm in /srv/models/Kimi-K2.5 "
                        "(model-00031-of-000064.safetensors); expected all readable",
    # issue 40: an account that existed in a group that hands out root keeps it (ansible.builtin.user does not touch
    # supplementary groups): the checkpoint's remote code would run with it
    "privileged_user": "service user vllm: measured member of docker; expected none of the groups that hand out root",
    # issue 42: the KV cache of one request of the model's full length cannot fit beside ~72 GiB of weights per GPU;
    # vLLM would say so after the whole load.  The numbers come from the ~595 GB checkpoint's own headers
    "kv_too_long": "weights 71.8 GiB (551.4 GiB / 8 ranks + 2.9 GiB on every rank), drafter 0.3 GiB, engine overhead "
                   "5.0 GiB + sampler profile 0.2 GiB (128 sequences) leave 13.6 GiB for the KV cache: 195,666 tokens "
                   "at 70,272 B + drafter 4,096 B per token; deployer_max_model_len 262,144 needs 18.2 GiB; expected "
                   "room for one request of that length",
}


@pytest.mark.parametrize("case", list(PREFLIGHT_CASES))
def test_03_preflight_failure_changes_nothing(case):
    before = host_state()
    extra = []
    if case == "seven_gpus":
        sbx.set_knobs(H, gpus={"count": 7})
    elif case == "no_driver":
        sbx.set_knobs(H, gpus={"driver_loaded": False})
    elif case == "old_driver":
        sbx.set_knobs(H, gpus={"driver": "550.54.15"})
    elif case == "mig_enabled":
        sbx.set_knobs(H, gpus={"mig": ["Disabled", "Disabled", "Enabled"]})
    elif case == "wrong_gpu":
        sbx.set_knobs(H, gpus={"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559})
    elif case == "missing_shard":
        sh(f"mv {MODEL_DIR}/model-00017-of-000064.safetensors /root/shard17")
    elif case == "truncated_shard":
        sh(f"cp -p {MODEL_DIR}/model-00023-of-000064.safetensors /root/shard23 && "
           f": > {MODEL_DIR}/model-00023-of-000064.safetensors")
    elif case == "missing_config":
        sh(f"mv {MODEL_DIR}/config.json /root/config.json")
    elif case == "unreadable_shard":
        shard31_mode = sh(f"stat -c %a {MODEL_DIR}/model-00031-of-000064.safetensors")
        sh(f"chmod 0600 {MODEL_DIR}/model-00031-of-000064.safetensors")
    elif case == "bad_drafter":
        extra = ["-e", "deployer_drafter_src_dir=/nonexistent/drafter"]
    elif case == "privileged_user":
        sh("getent group docker >/dev/null || groupadd --system docker; usermod -aG docker vllm")
    elif case == "kv_too_long":
        extra = ["-e", "deployer_max_model_len=262144"]
    else:
        extra = ["-e", "preflight_disk_margin_gib=100000"]
    try:
        r = up(*extra, "-e", "deployer_gpu_memory_utilization=0.95")  # a would-be new release
    finally:
        sbx.set_knobs(H, gpus={})
        sh(f"test -f /root/shard17 && mv /root/shard17 {MODEL_DIR}/model-00017-of-000064.safetensors; true")
        sh(f"test -f /root/config.json && mv /root/config.json {MODEL_DIR}/config.json; true")
        sh(f"test -f /root/shard23 && mv /root/shard23 {MODEL_DIR}/model-00023-of-000064.safetensors; true")
        if case == "unreadable_shard":
            sh(f"chmod {shard31_mode} {MODEL_DIR}/model-00031-of-000064.safetensors")
        if case == "privileged_user":
            sh("gpasswd -d vllm docker >/dev/null")
    assert r.returncode == 3, r.stdout + r.stderr
    expect = PREFLIGHT_CASES[case]
    assert expect in " ".join(r.stderr.split()), r.stderr
    assert host_state() == before
    last = json.loads(sh("tail -1 /opt/deployer/audit.jsonl"))
    assert last["result"] == "failed" and last["failed_stage"] == "preflight"


def test_03b_busy_gpus_are_refused_when_our_server_is_not_running():
    sh(f"systemctl stop {SVC}")
    sbx.set_knobs(H, gpus={"used_mib": [0, 0, 0, 41234, 0, 0, 0, 0]})
    try:
        before = host_state()
        r = up()
        after = host_state()
    finally:
        sbx.set_knobs(H, gpus={})
    assert r.returncode == 3, r.stdout + r.stderr
    assert ("GPU 3: measured 41234 MiB in use with deployer-engine not running; expected <= 2048 MiB"
            in flat(r.stderr)), r.stderr
    assert after == before
    # GPUs free again: the live release is started again, nothing else changes; two GPU pairs the driver says cannot
    # read each other's memory (nvidia-smi topo -p2p r) are said before the load, not refused
    sbx.set_knobs(H, gpus={"p2p": {"0,4": "CNS", "3,7": "CNS"}})
    try:
        r = up()
    finally:
        sbx.set_knobs(H, gpus={})
    assert r.returncode == 0, r.stdout + r.stderr
    assert sh(f"systemctl is-active {SVC}") == "active"
    assert ("nvidia-smi topo -p2p r reports no peer-to-peer reads for 2 of 28 GPU pairs (measured: GPU0-GPU4 CNS, "
            "GPU3-GPU7 CNS; CNS = Chipset not supported)" in flat(r.stdout + r.stderr)), r.stdout + r.stderr


def test_03c_a_foreign_process_on_the_port_is_refused():
    sh(f"systemctl stop {SVC}")
    sh("systemd-run --unit foreign-8000 /usr/bin/python3 -m http.server 8000 --bind 127.0.0.1")
    try:
        for _ in range(50):
            if "LISTEN" in sh("ss -H -ltn 'sport = :8000' || true"):
                break
            __import__("time").sleep(0.2)
        r = up()
    finally:
        sh("systemctl stop foreign-8000 || true")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "port 8000: measured in use by pid" in flat(r.stderr), r.stderr
    assert "(python3); expected free or held by deployer-engine" in flat(r.stderr), r.stderr
    assert up().returncode == 0 and sh(f"systemctl is-active {SVC}") == "active"


def test_04_crash_during_load_is_reported_within_seconds_and_rolled_back():
    live = sh("readlink /opt/deployer/current")
    sbx.set_knobs(H, standin={"crash_phase": "weights", "load_seconds": 4, "only_if_arg": "0.955"})
    try:
        r = up("-e", "deployer_gpu_memory_utilization=0.955", "-e", "watch_budget_seconds=1200", *FAST)
    finally:
        sbx.set_knobs(H, standin={})
    assert r.returncode == 1, r.stdout + r.stderr
    err = " ".join(r.stderr.split())
    assert "deploy failed in stage 'watch'; rolled back to the last live release" in err
    assert "CUDA out of memory" in err and "loading weights" in err
    assert "timeout: not ready after" not in err, err    # seen when it happened, not at the budget
    assert sh("readlink /opt/deployer/current") == live
    assert sh(f"systemctl is-active {SVC}") == "active"
    assert sh("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health") == "200"
    failed = [json.loads(sh(f"cat {d}/release.json")) for d in sh("ls -d /opt/deployer/releases/*").split()]
    assert any(f.get("result") == "failed" and f.get("failed_stage") == "watch" for f in failed)


def test_05_patching_disabled_fails_at_verification_before_any_restart():
    assert up().returncode == 0            # the default release is live (a no-op when it already is)
    pid = main_pid()
    unit = sh(f"sha256sum /etc/systemd/system/{SVC}.service")
    r = up("-e", "deployer_patch_enabled=false", "-e", "deployer_gpu_memory_utilization=0.956")
    assert r.returncode == 4, r.stdout + r.stderr
    err = " ".join(r.stderr.split())
    assert "verification failed before any restart" in err
    assert "Model does not support EAGLE3 interface but aux_hidden_state_outputs was requested" in err
    assert "Eagle3 is only supported for" in err          # vLLM's own config validation (P4 missing)
    assert main_pid() == pid and sh(f"sha256sum /etc/systemd/system/{SVC}.service") == unit
    # the refused deploy used its own venv: the live release's venv is still patched, and the live
    # server survives its own restart (a crash or a reboot would do the same)
    assert sh(f"test -d {venv(patched=False)} && echo separate") == "separate"
    assert sh(f"test -d {venv()}/lib/python3.11/site-packages/vllm/.deployer_patch "
              "&& echo patched || echo pristine") == "patched"
    sh(f"systemctl restart {SVC}")
    for _ in range(120):
        if sh("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health || true") == "200":
            break
        __import__("time").sleep(1)
    assert sh("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health || true") == "200", \
        sh(f"journalctl -u {SVC} --no-pager -n 30")
    r = up()  # nothing to repair: the live release is unchanged
    assert r.returncode == 0 and "unchanged, nothing restarted" in r.stdout, r.stdout + r.stderr


def test_06_check_mode_changes_nothing_and_hides_secrets():
    before = host_state()
    r = up("--check", "--diff", "-e", "deployer_max_model_len=4096", "-e", "deployer_api_key=sekrit-check-123")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "would be verified and started" in flat(r.stderr)
    assert re.search(r'^\+\s+"4096",?$', r.stderr, re.M), r.stderr     # --diff shows what would change
    assert "sekrit-check-123" not in r.stdout + r.stderr
    assert host_state() == before


def test_07_api_key_protects_the_server_and_never_shows():
    import shlex
    # from the environment, and with every character systemd's env-file parser treats specially
    key = "sekrit-$HOME-%n-\"q\"-'s'-a b-\\x-456"
    env = dict(os.environ, DEPLOYER_API_KEY=key)
    r = up("--diff", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "sekrit" not in r.stdout + r.stderr
    assert "sekrit" not in sh(f"systemctl cat {SVC}") and "sekrit" not in sh(f"journalctl -u {SVC} --no-pager")
    assert sh("curl -s -o /dev/null -w '%{http_code}' localhost:8000/v1/models") == "401"
    # systemd decoded the env file back to exactly this key: the server accepts it
    assert sh("curl -s -o /dev/null -w '%{http_code}' -H " + shlex.quote("Authorization: Bearer " + key)
              + " localhost:8000/v1/models") == "200"
    assert "sekrit" not in sh("cat /opt/deployer/audit.jsonl /opt/deployer/current/release.json")


def test_08_native_vllm_serves_without_patches():
    # vLLM's own checks are not what this is about (the stand-in asks 0.18.0's own supports_eagle3, asserted below;
    # the verify stage on a native release: the real engine, test_real_engine.py); they cost ~27 CPU-s and ~25 s here
    r = up("-e", "deployer_vllm_version=0.18.0", *FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "native support in vLLM 0.18.0" in flat(r.stderr)
    rel = json.loads(sh("cat /opt/deployer/current/release.json"))
    assert rel["vllm_version"] == "0.18.0" and rel["patch_fingerprint"] is None and rel["patches"] == []
    assert "supports_eagle3(KimiK25ForConditionalGeneration) = True (vLLM 0.18.0" in sh(
        f"journalctl -u {SVC} --no-pager")
    assert sh(f"test -d {venv('0.18.0')}/lib/python3.11/site-packages/vllm/.deployer_patch "
              "&& echo patched || echo pristine") == "pristine"


def test_09_a_changed_host_key_is_refused():
    kh = sbx.STATE / "known_hosts"
    good = kh.read_text()
    sbx.close_masters()  # a live ControlMaster would skip the host-key check
    wrong = sbx.STATE / "wrong_key"
    os.system(f"rm -f {wrong} {wrong}.pub; ssh-keygen -q -t ed25519 -N '' -f {wrong}")
    fake = wrong.with_suffix(".pub").read_text().split()
    kh.write_text("\n".join(f"{line.split()[0]} {fake[0]} {fake[1]}" for line in good.splitlines() if line) + "\n")
    try:
        r = up()
    finally:
        kh.write_text(good)
    assert r.returncode == 5, r.stdout + r.stderr
    assert "Host key verification failed" in r.stderr or "REMOTE HOST IDENTIFICATION HAS CHANGED" in r.stderr


def test_09b_an_unknown_host_is_refused_until_trusted_and_an_unreachable_one_is_exit_5(tmp_path):
    """`--host` (an ad-hoc inventory): an unknown host key is refused (host key checking stays on: the runner sets
    it, whatever the environment says), `--trust-new-host` records it on first contact (accept-new: a changed one
    stays refused, test_09), and a host where nothing answers is exit 5 naming it.  Read-only commands: nothing is
    deployed."""
    from sandbox_helpers import deployer
    ip = sbx.host(1).ip
    kh = tmp_path / "known_hosts"
    sbx.close_masters()
    adhoc = ["--host", ip, "--key", str(sbx.STATE / "id_ed25519"),
             "-e", f"ansible_ssh_args=-o ControlMaster=no -o UserKnownHostsFile={kh}"]   # no shared master
    r = deployer("releases", *adhoc)
    assert r.returncode == 5, r.stdout + r.stderr
    assert "Host key verification failed" in r.stdout + r.stderr, r.stdout + r.stderr
    assert not kh.exists() or ip not in kh.read_text()
    r = deployer("releases", *adhoc, "--trust-new-host")
    assert r.returncode == 0, r.stdout + r.stderr
    pub = (sbx.host(1).dir / "ssh_host_ed25519_key.pub").read_text().split()[1]
    import subprocess
    assert pub in kh.read_text()
    assert subprocess.run(["ssh-keygen", "-F", ip, "-f", str(kh)], capture_output=True).returncode == 0   # hashed
    r = deployer("releases", *adhoc)                       # known now: no flag needed
    assert r.returncode == 0, r.stdout + r.stderr
    r = deployer("releases", "--host", ip, "--port", "1", "--key", str(sbx.STATE / "id_ed25519"), "--trust-new-host")
    assert r.returncode == 5, r.stdout + r.stderr
    assert ip in r.stdout + r.stderr and "unreachable" in (r.stdout + r.stderr).lower(), r.stdout + r.stderr
