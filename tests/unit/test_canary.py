"""The GPU canary's verdict (deployer/canary.py) on reports a real GPU gave (tests/fixtures/real-gpu/canary), the
unit properties it runs with, and the sandbox's stand-in rank held to the real rank's lines."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from deployer import canary

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests/fixtures/real-gpu/canary"
UNIT = ROOT / "tests/golden"


def real(name):
    return canary.read_report((REAL / name).read_text())


def test_a_real_good_run_passes_with_what_it_measured():
    v = canary.verdict(real("world1.txt"), 1)
    assert v["refusal"] is None and v["ok"] and v["not_run"] is None
    assert v["measured"]["cuda_init_seconds"] == 4.704
    assert v["measured"]["probes"] == {"vllm_marlin_repack": "skipped", "vllm_moe_topk": "skipped"}
    assert "NVIDIA H100 80GB HBM3" in v["summary"] and "Triton compiled and ran a kernel" in v["summary"]
    assert "No module named 'vllm'" in v["summary"]


def test_a_real_vllm_release_kernels_run_and_pass():
    """The release's own kernels asked for on a real GPU with a real vLLM build (0.22.0 on an H100, 2026-12-06): both
    probes ran; the judge counts them run, not skipped."""
    for name in ("world1_vllm_0.22.0.txt", "world1_vllm_0.22.0_warm.txt"):
        v = canary.verdict(real(name), 1)
        assert v["refusal"] is None and v["ok"], v
        assert v["measured"]["probes"] == {"vllm_marlin_repack": "ok", "vllm_moe_topk": "ok"}, v["measured"]
        assert "skipped" not in v["summary"], v["summary"]


def test_a_real_marlin_moe_gemm_ran_and_its_answer_checked_cold_and_warm():
    """Kimi-K2.5's INT4 expert GEMM (moe_wna16_marlin_gemm) on a real GPU with a real vLLM build (0.22.0 on an H200,
    2026-12-06), on weights the release's own gptq_marlin_repack repacked, checked against a value that needs no
    knowledge of Marlin's layouts.  0.22.0's _moe_C carries only PTX for 15 of its 37 units on sm_90 as on sm_120:
    the cold run is the driver's JIT compile (what vllm#38619's 570 driver could not do), the warm one its cache."""
    cold, warm = (canary.verdict(real(f"world1_vllm_0.22.0_marlin_moe{w}.txt"), 1) for w in ("", "_warm"))
    for v in (cold, warm):
        assert v["refusal"] is None and v["ok"], v
        assert v["measured"]["probes"] == {"vllm_marlin_repack": "ok", "vllm_moe_topk": "ok",
                                           "vllm_marlin_moe": "ok"}, v["measured"]
    probes = {r: {p["probe"]: p for p in real(f"world1_vllm_0.22.0_marlin_moe{r}.txt")["ranks"][0]["probes"]}
              for r in ("", "_warm")}
    assert probes[""]["vllm_marlin_moe"]["max_error"] == 0.0016 and probes[""]["vllm_marlin_moe"]["experts"] == 8
    assert probes[""]["vllm_marlin_moe"]["seconds"] > 50 > 1 > probes["_warm"]["vllm_marlin_moe"]["seconds"]


def test_a_real_fa2_prefill_ran_and_matched_torch_cold_and_warm():
    """FlashAttention 2 (the EAGLE-3 drafter's attention) on the same H200 and vLLM 0.22.0: its _vllm_fa2_C carries
    only PTX (52 of 52 units on sm_90 as on sm_120), so the cold call is the driver's JIT; checked against torch."""
    for w in ("", "_warm"):
        v = canary.verdict(real(f"world1_vllm_0.22.0_fa2{w}.txt"), 1)
        assert v["refusal"] is None and v["ok"] and v["measured"]["probes"]["vllm_fa2"] == "ok", v
    fa2 = {w: [p for p in real(f"world1_vllm_0.22.0_fa2{w}.txt")["ranks"][0]["probes"] if p["probe"] == "vllm_fa2"][0]
           for w in ("", "_warm")}
    assert fa2[""]["max_error"] == 0.0077 and fa2[""]["head_dim"] == 128
    assert fa2[""]["seconds"] > 10 > 1 > fa2["_warm"]["seconds"]


def test_a_real_gpu_that_fails_cuda_init_is_named_not_the_rank_that_waited_for_it():
    for f in ("world2_nccl30.txt", "world2_timeout.txt"):
        v = canary.verdict(real(f), 2)
        assert v["refusal"].startswith("GPU 1: CUDA init failed: torch.AcceleratorError: CUDA error: invalid device "
                                       "ordinal"), v["refusal"]
        assert "GPU 0" not in v["refusal"]


def test_a_real_gpu_without_room_is_not_run_and_said():
    v = canary.verdict(real("nomem.txt"), 1)
    assert v["refusal"] is None and v["ok"]
    assert v["not_run"] == ("GPU 0 has 80552 MiB free beside the live server, the canary needs 999999 "
                            "(canary_min_free_mib): not run, the load will find out")


def _report(world=2, timed_out=False, **per_rank):
    ok = {"cuda": {"ok": True, "name": "G", "compute_cap": "12.0", "seconds": 2.0},
          "memory": {"ok": True, "free_mib": 90000, "needed_mib": 2048}, "nccl_init": {"ok": True},
          "nccl": {"ok": True, "seconds": 0.4, "allreduce_mib": 64, "bus_gbps": 21.5},
          "triton": {"ok": True, "seconds": 1.1}, "done": {"ok": True}}
    ranks = []
    for r in range(world):
        steps = per_rank.get(f"r{r}", ok)
        ranks.append({"rank": r, "steps": dict(steps), "probes": [], "stderr": "", "exit": 0})
    return {"world": world, "timed_out": timed_out, "timeout_s": 180.0, "ranks": ranks, "seconds": 5.0}


UNTIL_INIT = {"cuda": {"ok": True, "seconds": 2}, "memory": {"ok": True}, "nccl_init": {"ok": True}}


def test_a_rank_that_never_joins_is_named_with_where_it_stayed():
    v = canary.verdict(_report(timed_out=True, r0=UNTIL_INIT, r1={}), 2)
    assert v["refusal"] == ("GPU 1: its rank never joined the NCCL group (still in CUDA init when the canary's "
                            "limit of 180.0 s ran out); expected all 2 ranks to join: tensor parallelism would wait "
                            "on it for the whole NCCL timeout")


def test_an_all_reduce_every_rank_joined_and_that_never_ends_points_at_p2p():
    v = canary.verdict(_report(timed_out=True, r0=UNTIL_INIT, r1=UNTIL_INIT), 2)
    assert v["refusal"].startswith("the NCCL all-reduce over 2 GPUs did not finish within 180.0 s (2 ranks still in "
                                   "it): every rank joined")
    assert "NCCL_P2P_DISABLE=1" in v["refusal"]


def test_a_failed_release_kernel_and_a_failed_triton_refuse():
    r = _report(world=1)
    r["ranks"][0]["probes"] = [{"ok": False, "probe": "vllm_marlin_repack",
                                "error": "torch.AcceleratorError: CUDA error: no kernel image is available"}]
    assert canary.verdict(r, 1)["refusal"].startswith("GPU 0: the release's kernel vllm_marlin_repack failed: "
                                                      "torch.AcceleratorError: CUDA error: no kernel image")
    r = _report(world=1, r0=dict(_report()["ranks"][0]["steps"], triton={"ok": False, "error": "CalledProcessError"}))
    assert "Triton could not compile and run a kernel as the service user" in canary.verdict(r, 1)["refusal"]


def test_no_report_and_a_wrong_rank_count_refuse():
    assert canary.judge({"rc": 1, "stdout": "", "stderr": "Failed to start transient service unit: boom\n"}, 8)[
        "refusal"] == ("the GPU canary printed no report (exit 1): Failed to start transient service unit: boom; "
                       "expected one line starting DEPLOYER-CANARY")
    assert canary.verdict(_report(world=2), 8)["refusal"].startswith("the GPU canary ran 2 ranks, expected 8")


def test_systemds_own_exit_status_is_named_as_systemds_not_the_canarys():
    """Issue 55: a deploy was refused with "the canary printed no report (exit 219): no output" - 219 is systemd's
    EXIT_CGROUP (systemd.exec(5)): the canary never ran.  The run is tried once more (roles/canary/tasks/run.yml);
    then systemd's reason is given, not a verdict on the GPUs."""
    v = canary.judge({"rc": 219, "stdout": "", "stderr": ""}, 8)
    assert v["refusal"] == ("systemd could not start the canary's process, twice: EXIT_CGROUP (219): setting up the "
                            "service's control group failed (no output); not the GPUs' verdict: the server's unit "
                            "has the same properties and would meet it too (journalctl -b -u 'run-*' says more)")
    assert canary.systemd_failure(217) == "EXIT_USER (217): determining or changing the user failed (User=)"
    assert canary.systemd_failure(1) == canary.systemd_failure(223) == canary.systemd_failure(None) == ""


def test_the_canary_runs_with_the_units_own_lines_but_how_systemd_starts_and_logs_it():
    unit = ("[Unit]\nDescription=x\nAfter=a.service\n[Service]\nType=simple\nEnvironmentFile=/r/vllm.env\n"
            "LoadCredential=api_key:/s/api_key\nUser=kimi\nExecStart=/v/bin/vllm serve \\\n  /m\nRestart=always\n"
            "LimitMEMLOCK=infinity\n# hardening\nNoNewPrivileges=yes\nCapabilityBoundingSet=\n"
            "SystemCallFilter=~@clock @mount\nSystemCallFilter=~ptrace\nDeviceAllow=char-nvidia-uvm rw\n"
            "StandardOutput=journal\n[Install]\nWantedBy=multi-user.target\n")
    assert canary.run_properties(unit) == [
        "-p", "EnvironmentFile=/r/vllm.env", "-p", "User=kimi", "-p", "LimitMEMLOCK=infinity",
        "-p", "NoNewPrivileges=yes", "-p", "CapabilityBoundingSet=", "-p", "SystemCallFilter=~@clock @mount",
        "-p", "SystemCallFilter=~ptrace", "-p", "DeviceAllow=char-nvidia-uvm rw"]


def test_the_golden_unit_keeps_every_hardening_line_for_the_canary():
    text = next(p for p in sorted(UNIT.glob("*.service"))).read_text()
    props = canary.run_properties(text)[1::2]
    for want in ("ProtectSystem=strict", "NoNewPrivileges=yes", "DevicePolicy=closed", "LimitMEMLOCK=infinity",
                 "PrivateTmp=yes", "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK"):
        assert want in props
    assert not [p for p in props if p.split("=")[0] in canary.NOT_RUN_PROPERTIES]
    assert not [p for p in props if p.startswith("LoadCredential")]


STANDIN = ROOT / "deployer/sandbox/canary_rank.py"


@pytest.mark.parametrize("world", [1, 3])
def test_the_standin_rank_speaks_the_real_ranks_lines(tmp_path, world):
    """The real canary (orchestrator) over the stand-in rank: the same steps with the same keys as the H100 run."""
    out = subprocess.run([sys.executable, str(ROOT / "roles/canary/files/gpu_canary.py"), "--world", str(world),
                          "--timeout-s", "30", "--probe", "vllm_marlin_repack",
                          f"--rank-program={sys.executable}", f"--rank-program={STANDIN}"],
                         capture_output=True, text=True, timeout=60)
    got = canary.read_report(out.stdout)
    want = real("world1.txt")["ranks"][0]
    for rk in got["ranks"]:
        assert list(rk["steps"]) == list(want["steps"]) if rk["rank"] == 0 else \
            [s for s in want["steps"] if s != "triton"]
        for step, ev in rk["steps"].items():
            assert set(ev) == set(want["steps"][step]), step
        assert set(rk["probes"][0]) - {"skipped"} <= set(want["probes"][0]) | {"ok"}
    v = canary.verdict(got, world)
    assert v["refusal"] is None and "vllm_marlin_repack" in v["summary"], v


def test_the_standins_failures_read_like_the_real_ones():
    """The real failure lines (H100) and the stand-in's carry the same error text shapes."""
    cuda_err = real("world2_nccl30.txt")["ranks"][1]["steps"]["cuda"]["error"]
    store_err = real("world2_nccl30.txt")["ranks"][0]["steps"]["nccl"]["error"]
    src = STANDIN.read_text()
    assert cuda_err.startswith("torch.AcceleratorError: CUDA error: ") and 'CUDA_ERROR = "torch.AcceleratorError: ' \
        'CUDA error: %s"' in src
    import re
    assert re.fullmatch(r"torch\.distributed\.DistStoreError: Timed out after \d+ seconds waiting for clients\. "
                        r"\d+/\d+ clients joined\.", store_err)
    assert '"torch.distributed.DistStoreError: Timed out after %d seconds waiting for clients. "' in src
    assert json.loads(json.dumps(cuda_err))


def test_a_rank_that_dies_before_the_all_reduce_stops_the_group_at_once(tmp_path):
    """Not after NCCL's own timeout: the ranks that wait for a dead one are stopped when it ends."""
    prog = tmp_path / "rank.py"
    prog.write_text("import json, sys, time\nr = int(sys.argv[sys.argv.index('--rank') + 1])\n"
                    "p = lambda s, ok=True: print(json.dumps({'rank': r, 'step': s, 'ok': ok}), flush=True)\n"
                    "p('cuda', r == 0)\nif r: sys.stderr.write('Traceback ...\\nRuntimeError: boom\\n'); sys.exit(1)\n"
                    "p('memory'); p('nccl_init'); time.sleep(60)\n")
    import time
    t = time.monotonic()
    out = subprocess.run([sys.executable, str(ROOT / "roles/canary/files/gpu_canary.py"), "--world", "2",
                          "--timeout-s", "50", f"--rank-program={sys.executable}", f"--rank-program={prog}"],
                         capture_output=True, text=True, timeout=60)
    assert time.monotonic() - t < 20
    got = canary.read_report(out.stdout)
    assert got["stopped_by"] == 1 and not got["timed_out"] and got["ranks"][0]["exit"] == -9
    assert got["ranks"][1]["stderr"].endswith("RuntimeError: boom\n")
    assert canary.verdict(got, 2)["refusal"].startswith("GPU 1: CUDA init failed")
