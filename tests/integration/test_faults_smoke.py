"""First-deploy, smoke and rollback failures on a sandbox host: each ends with the right message, exit code and a
serving host.

vLLM's own checks are skipped here (``verify_enabled=false``): they are tested elsewhere, and each
case would pay ~35 s for them.  Every failure knob is tied to one argv word (``only_if_arg``), so
the release rolled back to starts normally.
"""
import json
import re

import pytest

from deployer.sandbox.hosts import set_knobs
from sandbox_helpers import (
    FAST,
    SVC,
    auth,
    fail_with,
    flat,
    health,
    knobs,
    main_pid,
    needs_sandbox,
    sandbox_hosts,
    sh,
    stages,
    up,
)

pytestmark = [pytest.mark.sandbox, needs_sandbox]
H = "sbx1"


@pytest.fixture(scope="module", autouse=True)
def sandbox():
    yield from sandbox_hosts(1, package_cache=False)   # installs nothing: no package cache to link



def test_00_a_first_deploy_that_fails_leaves_the_server_stopped():
    knobs(crash_phase="kv_cache", load_seconds=3)
    try:
        r = up(*FAST)
    finally:
        knobs()
    assert r.returncode == 1, r.stdout + r.stderr
    assert "deploy failed in stage 'watch'; no live release to roll back to, server stopped" in flat(r.stderr)
    assert sh(H, "test -e /opt/deployer/current && echo yes || echo no") == "no"
    assert sh(H, f"systemctl is-active {SVC} || true") == "inactive"
    assert sh(H, f"systemctl is-enabled {SVC} || true") == "disabled"
    rel = json.loads(sh(H, "cat /opt/deployer/releases/*/release.json"))
    assert rel["result"] == "failed" and rel["failed_stage"] == "watch"


def test_01_then_a_good_deploy_serves():
    r = up(*FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    assert health() == "200"


@pytest.mark.parametrize("case,knob,expect", [
    ("http_500", {"chat_status": 500}, "chat completion: measured HTTP 500"),
    # a broken INT4 MoE kernel's answer (vllm#40357); an empty one is the same check (tests/unit/test_answer_shape.py)
    ("garbage", {"reply_text": "foss " * 31 + "foss"}, "the answer is not language: it is 'foss' repeated (32 words)"),
    ("no_drafts", {"no_drafts": True}, "EAGLE-3: measured 0 new drafts"),
])
def test_smoke_failures_roll_back(case, knob, expect):
    live = sh(H, "readlink /opt/deployer/current")
    arg = {"http_500": "0.9531", "garbage": "0.9532", "no_drafts": "0.9533"}[case]
    r = fail_with(arg, **knob)
    assert r.returncode == 1, r.stdout + r.stderr
    err = flat(r.stderr)
    assert "deploy failed in stage 'smoke'; rolled back to the last live release" in err, err
    assert expect in err, err
    assert sh(H, "readlink /opt/deployer/current") == live and health() == "200"


def test_an_answer_that_is_all_reasoning_is_a_good_load():
    """Kimi's template thinks first: with a reasoning parser a short answer lands entirely in the reasoning field
    (vLLM's `reasoning`), content null.  The smoke took that for no text and rolled a good load back (issue 42)."""
    live = sh(H, "readlink /opt/deployer/current")
    knobs(reasoning_only=True)
    try:
        r = up("-e", "deployer_gpu_memory_utilization=0.9534", *FAST)
    finally:
        knobs()
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'served: "(reasoning) Sandbox stand-in reply' in flat(r.stderr), r.stderr
    assert sh(H, "readlink /opt/deployer/current") != live and health() == "200"
    assert up(*FAST).returncode == 0 and sh(H, "readlink /opt/deployer/current") == live   # the defaults again


def test_a_server_that_dies_at_its_first_sampled_request_is_rolled_back_with_the_reason():
    """Issue 42: Triton and FlashInfer compile sampling kernels at the first non-greedy request; on a host without a C
    compiler the engine dies there - the greedy smoke passed and the release went live.  The smoke now sends one
    sampled request too: the engine's death is caught before the release is recorded, named from the journal
    (no_compiler, with the packages to install) and the live release is put back."""
    live = sh(H, "readlink /opt/deployer/current")
    r = fail_with("0.9536", sampling_dies=True)
    assert r.returncode == 1, r.stdout + r.stderr
    out = flat(r.stdout + r.stderr)
    assert "sampled chat completion (temperature 0.7): measured HTTP 500" in out, out[-3000:]
    assert "the engine's journal: no_compiler: " in out and "install gcc and python3-dev" in out, out[-3000:]
    assert sh(H, "readlink /opt/deployer/current") == live and health() == "200"


def test_a_host_without_a_c_compiler_is_refused_before_the_restart():
    """Issue 42: Triton compiles its kernels' launchers at run time with the host's C compiler (TRITON_MLA, the only
    MLA backend on sm_120, and the sampling kernels); a minimal server image has none, and the server died after its
    load.  The verify stage reads the toolchain as the service user in the unit's environment and refuses first."""
    live, pid = sh(H, "readlink /opt/deployer/current"), main_pid(H)
    hide = "for c in gcc clang; do p=$(command -v $c) && mv $p $p.hidden-by-test; done; true"
    back = "for p in /usr/bin/*.hidden-by-test; do [ -e $p ] && mv $p ${p%.hidden-by-test}; done; true"
    sh(H, hide)
    try:
        r = up("-e", "deployer_gpu_memory_utilization=0.9537")           # vLLM's checks on: the verify stage runs
    finally:
        sh(H, back)
    out = flat(r.stdout + r.stderr)
    assert r.returncode == 4, out[-3000:]
    assert "run-time toolchain, as the service user vllm in the unit's environment: C compiler: measured none " \
           "(CC unset; no gcc or clang on /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin" in out, out[-3000:]
    assert "Python.h" not in out.split("run-time toolchain", 1)[1].split("Triton compiles", 1)[0]   # it is there
    assert sh(H, "readlink /opt/deployer/current") == live and main_pid(H) == pid


def test_a_driver_older_than_the_releases_kimi_kernels_need_is_refused_before_the_restart():
    """Issue 42 (vllm#38619): vLLM 0.16's INT4 Marlin MoE carries no sm_120 machine code, only PTX ISA 8.8, which a
    570 driver cannot compile - the server died right after its 64 shards loaded.  The verify stage reads the
    installed wheel's CUDA libraries on the host and refuses first, naming the libraries, their kernels and the
    floor."""
    live, pid = sh(H, "readlink /opt/deployer/current"), main_pid(H)
    set_knobs(H, gpus={"driver": "570.133.20"})     # passes preflight's own floor for sm_120 (570)
    try:
        r = up("-e", "deployer_gpu_memory_utilization=0.9538")     # vLLM's checks on: the verify stage runs
    finally:
        set_knobs(H, gpus={})
    out = flat(r.stdout + r.stderr)
    assert r.returncode == 4, out[-3000:]
    assert "NVIDIA driver: measured 570.133.20, expected >= 575.51.03 for this engine release on these GPUs: " in out
    assert "vllm/_C.abi3.so (core kernels, gptq_marlin_repack of Kimi's INT4 experts among them): 21 of 106 CUDA " \
           "units carry no machine code for sm_120, only PTX ISA 8.8 (CUDA 12.9)" in out, out[-3000:]
    assert "vllm/_moe_C.abi3.so (fused MoE, Kimi's INT4 Marlin MoE among them): 15 of 33" in out, out[-3000:]
    assert sh(H, "readlink /opt/deployer/current") == live and main_pid(H) == pid


@pytest.mark.parametrize("gpus,extra,expect", [
    ({"cuda_error": {"3": "uncorrectable ECC error encountered"}}, [],
     "GPU canary, before the restart: GPU 3: CUDA init failed: torch.AcceleratorError: CUDA error: uncorrectable ECC "
     "error encountered (1 of 8 GPUs failed it;"),
    ({"canary_hang": {"5": "cuda"}}, ["-e", "canary_timeout_seconds=4"],
     "GPU canary, before the restart: GPU 5: its rank never joined the NCCL group (still in CUDA init when the "
     "canary's limit of 4.0 s ran out); expected all 8 ranks to join"),
    ({"nccl_hang": True}, ["-e", "canary_timeout_seconds=4"],
     "GPU canary, before the restart: the NCCL all-reduce over 8 GPUs did not finish within 4.0 s (8 ranks still in "
     "it): every rank joined and the all-reduce never finished: PCIe peer-to-peer"),
], ids=["cuda-init-fails-on-one-gpu", "a-rank-never-joins", "the-all-reduce-hangs"])
def test_the_gpu_canary_refuses_before_the_restart(gpus, extra, expect):
    """Issue 42: what kills a load in its first minutes on a real host (a GPU that does not initialise, a rank that
    never joins, a P2P all-reduce that hangs) is found in seconds by the canary, run with the server unit's own
    properties, and nothing is restarted."""
    live, pid = sh(H, "readlink /opt/deployer/current"), main_pid(H)
    set_knobs(H, gpus=gpus)
    try:
        r = up("-e", "deployer_gpu_memory_utilization=0.9537", *FAST, *extra)
    finally:
        set_knobs(H, gpus={})
    out = flat(r.stdout + r.stderr)
    assert r.returncode == 4, out[-3000:]
    assert expect in out, out[-3000:]
    assert "sbx1 canary failed" in out
    assert sh(H, "readlink /opt/deployer/current") == live and main_pid(H) == pid
    assert sh(H, "pgrep -f '[c]anary_rank' || true") == ""       # no rank left behind


@pytest.mark.parametrize("gpus,expect", [
    ({"xid": {"3": [79], "1": [13]}, "pcie_width": {"6": 8}},
     "GPU health: GPU 3: the GPU fell off the bus (Xid 79 at PCI 0000:1b:00 since boot: pid=4242, name=python3, GPU "
     "has fallen off the bus.): reboot the host; if it comes back, reseat the card and check its power; expected none"),
    ({"reset_required": [5]}, "GPU health: GPU 5: the driver says the GPU needs a reset "
                              "(reset_status.reset_required: Yes): nvidia-smi -r -i 5 with nothing running on it"),
    ({"remapped_rows_pending": [2]}, "GPU health: GPU 2: a memory row remapping is pending"),
    ({"ecc_uncorrected": {"4": 3}}, "GPU health: GPU 4: uncorrected ECC errors since the driver loaded"),
    ({"temperature_c": {"1": 93}}, "GPU health: GPU 1: the GPU is at 93 C before the load"),
], ids=["xid-79", "reset-required", "row-remapping-pending", "uncorrected-ecc", "too-hot"])
def test_a_gpu_the_driver_has_given_up_on_is_refused_before_the_restart(gpus, expect):
    """Issue 55: a 25-minute load on a GPU that logged Xid 79, needs a reset, has a row remapping pending, uncorrected
    ECC errors or is at 90 C is lost.  Read from the host's own kernel log (journalctl -k -b) and nvidia-smi's fields,
    refused in the preflight (exit 3) naming the GPU, the evidence and what to do; the server is not touched."""
    live, pid = sh(H, "readlink /opt/deployer/current"), main_pid(H)
    set_knobs(H, gpus=gpus)
    try:
        r = up("-e", "deployer_gpu_memory_utilization=0.9539", *FAST)
    finally:
        set_knobs(H, gpus={})
    out = flat(r.stdout + r.stderr)
    assert r.returncode == 3, out[-3000:]
    assert expect in out, out[-3000:]
    if "xid" in gpus:     # an application's own Xid (13) is not the GPU's; what only slows the load is said
        assert "Xid 13" not in out and "GPU 6: PCIe link x8 of x16" in out, out[-3000:]
    assert sh(H, "readlink /opt/deployer/current") == live and main_pid(H) == pid
    assert sh(H, "journalctl -k -b -o cat | grep -c 'NVRM: Xid' || true") == "0"     # the rehearsal's lines gone


def test_a_gpu_that_dies_while_serving_is_not_restarted_into_and_status_names_it():
    """Issue 55: a GPU that logs Xid 79 while the server runs; every start systemd then makes (its own restarts after a
    crash, as this one) passes the GPU health gate first (the unit's drop-in, ExecStartPre=+): it refuses, stops the
    unit instead of leaving it to restart into the dead GPU, and is the run's root cause in `status`."""
    from sandbox_helpers import deployer
    assert up(*FAST).returncode == 0                                 # the default release live (a no-op if it is)
    set_knobs(H, gpus={"xid": {"3": [79]}})
    try:
        sh(H, f"systemctl restart {SVC} || true")
        for _ in range(20):
            state = sh(H, f"systemctl show -p ActiveState -p SubState {SVC}").split()
            if "SubState=start-pre" not in state:
                break
            __import__("time").sleep(0.5)
        # without the gate's stop systemd would wait RestartSec in auto-restart, then load again
        assert state in (["ActiveState=inactive", "SubState=dead"], ["ActiveState=failed", "SubState=failed"]), state
        text = sh(H, f"journalctl -u {SVC} -o cat --no-pager -n 30")
        assert "deployer GPU gate: refused to start deployer-engine: GPU 3: the GPU fell off the bus (Xid 79 at PCI " \
               "0000:1b:00 since boot: pid=4242, name=python3, GPU has fallen off the bus.): reboot the host" in text
        st = json.loads(deployer("status", "--sandbox", "--json").stdout)[H]
        assert st["last_fatal"]["kind"] == "gpu_unhealthy" and st["health"] != 200, st
    finally:
        set_knobs(H, gpus={})
    r = up(*FAST)                                                    # the GPU back: the live release starts again
    assert r.returncode == 0 and health() == "200", r.stdout + r.stderr


# What an engine or a model may print: Rich markup that does not close, a tensor-parallel prefix, terminal escapes
# (clear the screen, set the title, a clipboard write), a fake success line.
HOSTILE = ("weights at [/models/kimi] [/INST] [/] [rank0]: \x1b]0;owned\x1b\\\x1b[2J\x1b[1;32mdeploy OK\x1b[0m "
           "\x1b]52;c;ZWNobyBwd25lZA==\x07 \x9b31m")


def test_a_hostile_fatal_line_and_reply_are_shown_literally_and_change_nothing_else():
    """Issue 40: one [/...] in a fatal journal line killed the CLI (MarkupError) and with it the playbook, before the
    rollback put the last live release back.  Now the failed load rolls back exactly as any other, the line is shown
    as written, and no escape reaches the terminal; a served reply holding the same is a good deploy."""
    live = sh(H, "readlink /opt/deployer/current")
    r = fail_with("0.9535", crash_phase="kv_cache", load_seconds=3, crash_text=HOSTILE)
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert "\x1b" not in out and "\x9b" not in out and "\x07" not in out, repr(out[-3000:])
    err = flat(r.stderr)
    assert "deploy failed in stage 'watch'; rolled back to the last live release" in err, err
    assert "[/models/kimi] [/INST] [/] [rank0]:" in err, err
    assert sh(H, "readlink /opt/deployer/current") == live and health() == "200"
    knobs(reply_text="Sure. " + HOSTILE)
    try:
        r = up("-e", "deployer_gpu_memory_utilization=0.9536", *FAST)
    finally:
        knobs()
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "\x1b" not in out and "\x9b" not in out, repr(out[-3000:])
    assert 'served: "Sure. weights at [/models/kimi] [/INST]' in flat(r.stderr), r.stderr
    assert up(*FAST).returncode == 0 and sh(H, "readlink /opt/deployer/current") == live   # the defaults again


def test_no_rollback_leaves_the_failed_release_for_debugging():
    live = sh(H, "readlink /opt/deployer/current")
    r = fail_with("0.9541", ["--no-rollback"], crash_phase="compile", load_seconds=3)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "deploy failed in stage 'watch'; left in place (--no-rollback)" in flat(r.stderr)
    assert sh(H, "readlink /opt/deployer/current") == live                   # never flipped
    assert "0.9541" in sh(H, f"systemctl cat {SVC}")                          # the failed release's unit stays
    assert "rollback" not in stages(r.stderr, H)
    r = up(*FAST)                                                           # the next up converges
    assert r.returncode == 0, r.stdout + r.stderr
    assert sh(H, "readlink /opt/deployer/current") == live and health() == "200"


def test_speculative_disabled_serves_without_a_drafter():
    assert up(*FAST).returncode == 0          # a release with the drafter live and measured (a no-op if it is)
    r = up("-e", "deployer_speculative_enabled=false", *FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    argv = json.loads(sh(H, "cat /opt/deployer/current/argv.json"))
    assert "--speculative-config" not in argv
    assert stages(r.stderr, H).get("drafter") == "skipped"
    # EAGLE-3 against none, measured on this host: the release served before with the drafter is the baseline
    rel = json.loads(sh(H, "cat /opt/deployer/current/release.json"))
    pay = rel["speculation_payoff"]
    assert pay["plain_release"] == rel["id"] and pay["speculative_release"] != rel["id"], pay
    assert pay["plain_tokens_per_second"] == rel["tokens_per_second"] > 0 and pay["break_even_acceptance_length"] > 0
    assert f"against no speculation ({pay['plain_tokens_per_second']} tokens/s, release {rel['id']})" in \
        flat(r.stdout + r.stderr), r.stdout + r.stderr
    assert "no speculation" in sh(H, f"curl -s {auth()} localhost:8000/v1/chat/completions "
                                     "-H 'content-type: application/json' "
                                     "-d '{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}'")


def test_a_crash_loop_after_ready_is_named_by_status_with_its_fatal_line_and_rolled_back_when_asked(prom):
    """The load passed; later the server dies while serving, again after every restart.  systemd restarts it
    (Restart=always: the real API server, as the stand-in, exits 0 when its engine dies); `status` counts the
    restarts, calls it a CRASH LOOP at deployer_crash_loop_restarts, shows vLLM's own last fatal line (the
    journal, across restarts), and `status --rollback-if-crash-looping` returns the host to the previous release,
    which serves.  Guards: the crash loop flag, the last fatal line
    from the journal, and the rollback it triggers."""
    from sandbox_helpers import deployer
    assert up(*FAST).returncode == 0                                 # the default release live (a no-op if it is)
    live = sh(H, "basename $(readlink /opt/deployer/current)")
    # 12 s: long enough for the smoke test to finish first on a loaded machine (4 s failed it once: the server
    # died under the smoke's metrics read), short enough for three restarts within the wait below
    knobs(only_if_arg="0.9551", crash_after_ready_seconds=12)
    try:
        r = up("-e", "deployer_gpu_memory_utilization=0.9551", "-e", "deployer_restart_delay_seconds=1", *FAST)
        assert r.returncode == 0, r.stdout + r.stderr                 # smoke passed before the first crash
        looping = sh(H, "basename $(readlink /opt/deployer/current)")
        for _ in range(180):
            if int(sh(H, f"systemctl show -p NRestarts --value {SVC}") or 0) >= 3:    # the alert rule's limit
                break
            __import__("time").sleep(1)
        # a real Prometheus, scraping the host's node_exporter, fires the crash loop's alert (the keeper counts
        # systemd's restarts); its runbook names what to run
        for _ in range(40):
            alerts = [a for a in prom.get("/api/v1/alerts")["data"]["alerts"]
                      if a["labels"]["alertname"] == "DeployerCrashLooping" and a["state"] == "firing"]
            if alerts:
                break
            __import__("time").sleep(0.5)
        assert alerts and "--rollback-if-crash-looping" in alerts[0]["annotations"]["runbook"], \
            prom.get("/api/v1/alerts")
        loop = ("-e", "deployer_crash_loop_restarts=2")
        r = deployer("status", "--sandbox", "--json", *loop)
        st = json.loads(r.stdout)[H]
        assert r.returncode == 1 and int(st["unit"]["NRestarts"]) >= 2 and st["crash_loop"] is True, st
        assert st["last_fatal"]["line"] == "Worker proc VllmWorker-3 died unexpectedly, shutting down executor.", st
        r = deployer("status", "--sandbox", *loop)
        text = flat(r.stdout)
        assert "CRASH LOOP: systemd restarted the server" in text and "(limit 2)" in text, text
        # a worker that died without a word of its own (only the executor's): named as a silent death (issue 21)
        assert "last fatal (killed): Worker proc VllmWorker-3 died unexpectedly" in text, text
        assert f"roll back to {live}" in text, text
        # asked to, status rolls the crash-looping host back; the previous release serves
        r = deployer("status", "--sandbox", "--rollback-if-crash-looping", *loop)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "rolling back (crash loop): sbx1" in flat(r.stdout), r.stdout
        assert sh(H, "basename $(readlink /opt/deployer/current)") == live != looping and health() == "200"
        # the restart count begins again at the rollback's start (systemd keeps it when the unit is restarted
        # out of auto-restart: CI once saw status call the restored host crash-looping with NRestarts=2)
        assert sh(H, f"systemctl show -p NRestarts --value {SVC}") == "0"
        r = deployer("status", "--sandbox", "--json", *loop)
        assert r.returncode == 0 and json.loads(r.stdout)[H]["crash_loop"] is False, r.stdout
    finally:
        knobs()
    assert up(*FAST).returncode == 0 and health() == "200"           # back to the default release


def test_when_the_last_live_release_does_not_come_back_either_it_says_so():
    """Every start crashes (a host-wide fault): the deploy fails, the restore fails too, and the message says
    ROLLBACK FAILED (exit 1), not that the host is serving."""
    knobs(crash_phase="compile", load_seconds=3)
    try:
        r = up("-e", "deployer_gpu_memory_utilization=0.9561", *FAST)
    finally:
        knobs()
    assert r.returncode == 1, r.stdout + r.stderr
    # "crashed:" when the exit is seen first, "fatal:" when vLLM's traceback is (both are the same fault)
    assert re.search(r"ROLLBACK FAILED: the last live release did not come back \((crashed|fatal):", flat(r.stderr)), \
        r.stderr
    assert up(*FAST).returncode == 0 and health() == "200"           # the fault gone, the next up converges
