"""The GPU canary's verdict: what its report (roles/canary/files/gpu_canary.py) says about these GPUs.

Pure: fed the report and what ran it.  The first rank that failed is the cause, the ranks that waited on it are
not named as failures (a rank that never joins leaves every other one waiting in NCCL's init); a canary that had no
room beside the live server is not run and says so (the load will find out); anything else that fails refuses the
deploy before the restart, with the GPU, the step, what it measured and what was expected.
"""
from __future__ import annotations

ORDER = ("cuda", "memory", "nccl_init", "nccl", "triton", "done")
WHAT = {"cuda": "CUDA init", "memory": "the memory check", "nccl_init": "joining the NCCL group",
        "nccl": "the NCCL all-reduce", "triton": "the Triton kernel", "done": "the end"}
P2P_HINT = ("every rank joined and the all-reduce never finished: PCIe peer-to-peer through a translating IOMMU "
            "or ACS-enabled switches is the usual cause (docs/first-deploy.md); NCCL_P2P_DISABLE=1 in "
            "deployer_env_extra rules it in or out")


# systemd's own exit statuses (systemd.exec(5), "Process Exit Codes", systemd 252): the service manager could not set
# up the process (its cgroup, user, namespaces, ...) and the canary never ran.  Not the GPUs' verdict: the command is
# tried once more (roles/canary/tasks/run.yml), then refused with systemd's reason, which the server's own unit (the
# same properties) would meet too.
SYSTEMD_EXIT = {
    200: ("CHDIR", "changing to the working directory failed"), 201: ("NICE", "setting the nice level failed"),
    202: ("FDS", "closing or passing file descriptors failed"), 203: ("EXEC", "execve failed (a missing program?)"),
    204: ("MEMORY", "memory shortage"), 205: ("LIMITS", "adjusting resource limits failed (Limit*=)"),
    206: ("OOM_ADJUST", "adjusting the OOM score failed"), 207: ("SIGNAL_MASK", "setting the signal mask failed"),
    208: ("STDIN", "setting up standard input failed"), 209: ("STDOUT", "setting up standard output failed"),
    210: ("CHROOT", "changing the root directory failed"), 211: ("IOPRIO", "setting the IO priority failed"),
    212: ("TIMERSLACK", "setting the timer slack failed"), 213: ("SECUREBITS", "setting the secure bits failed"),
    214: ("SETSCHEDULER", "setting up CPU scheduling failed"), 215: ("CPUAFFINITY", "setting CPU affinity failed"),
    216: ("GROUP", "determining or changing the group failed"),
    217: ("USER", "determining or changing the user failed (User=)"),
    218: ("CAPABILITIES", "dropping capabilities failed"),
    219: ("CGROUP", "setting up the service's control group failed"),
    220: ("SETSID", "creating a session failed"), 221: ("CONFIRM", "cancelled at the console"),
    222: ("STDERR", "setting up standard error failed"), 224: ("PAM", "setting up the PAM session failed"),
    225: ("NETWORK", "setting up network namespacing failed"),
    226: ("NAMESPACE", "setting up mount namespacing failed (ReadOnlyPaths=, ProtectSystem=, ...)"),
    227: ("NO_NEW_PRIVILEGES", "disabling new privileges failed"),
    228: ("SECCOMP", "applying the system call filter failed"), 229: ("SELINUX_CONTEXT", "the SELinux context"),
    230: ("PERSONALITY", "setting the personality failed"), 231: ("APPARMOR_PROFILE", "the AppArmor profile"),
    232: ("ADDRESS_FAMILIES", "restricting address families failed"),
    233: ("RUNTIME_DIRECTORY", "setting up the runtime directory failed"), 235: ("CHOWN", "socket ownership"),
    236: ("SMACK_PROCESS_LABEL", "the SMACK label"), 237: ("KEYRING", "setting up the kernel keyring failed"),
    238: ("STATE_DIRECTORY", "the state directory"), 239: ("CACHE_DIRECTORY", "the cache directory"),
    240: ("LOGS_DIRECTORY", "the logs directory"), 241: ("CONFIGURATION_DIRECTORY", "the configuration directory"),
    242: ("NUMA_POLICY", "the NUMA policy"), 243: ("CREDENTIALS", "setting up credentials failed (LoadCredential=)"),
    245: ("BPF", "applying BPF restrictions failed"),
}


def systemd_failure(rc) -> str:
    """``EXIT_CGROUP (219): setting up the service's control group failed``, or "" for an exit of the canary's own."""
    if not isinstance(rc, int) or rc not in SYSTEMD_EXIT:
        return ""
    name, what = SYSTEMD_EXIT[rc]
    return f"EXIT_{name} ({rc}): {what}"


def _first_line(text) -> str:
    return (str(text or "").strip().splitlines() or [""])[0][:300]


def _last_line(text) -> str:
    return ([ln for ln in str(text or "").strip().splitlines() if ln.strip()] or [""])[-1][:300]


def _last_step(steps: dict) -> str:
    reached = [s for s in ORDER if s in steps]
    return reached[-1] if reached else ""


def verdict(report: dict | None, world: int, rc: int | None = None, stderr: str = "") -> dict:
    """{"ok", "not_run", "refusal", "summary", "measured"}: ``refusal`` None when the deploy may go on."""
    out = {"ok": False, "not_run": None, "refusal": None, "summary": "", "measured": {}}
    if not isinstance(report, dict) or not isinstance(report.get("ranks"), list):
        if systemd_failure(rc):
            out["refusal"] = (f"systemd could not start the canary's process, twice: {systemd_failure(rc)} "
                              f"({_last_line(stderr) or 'no output'}); not the GPUs' verdict: the server's unit has "
                              "the same properties and would meet it too (journalctl -b -u 'run-*' says more)")
            return out
        out["refusal"] = (f"the GPU canary printed no report (exit {rc}): {_last_line(stderr) or 'no output'}; "
                          "expected one line starting DEPLOYER-CANARY")
        return out
    ranks = report["ranks"]
    limit = report.get("timeout_s")
    if len(ranks) != world:
        out["refusal"] = f"the GPU canary ran {len(ranks)} ranks, expected {world} (one per GPU of the group)"
        return out
    short = [(r, s["memory"]) for r, s in ((rk["rank"], rk.get("steps") or {}) for rk in ranks)
             if not (s.get("memory") or {}).get("ok", True)]
    failed_cuda = [(rk["rank"], rk["steps"]["cuda"]) for rk in ranks
                   if not (rk.get("steps") or {}).get("cuda", {}).get("ok", True)]
    if failed_cuda:
        r, st = failed_cuda[0]
        out["refusal"] = (f"GPU {r}: CUDA init failed: {_first_line(st.get('error'))} "
                          f"({len(failed_cuda)} of {world} GPUs failed it; expected every GPU of the group to "
                          "initialise: the load would die on it after minutes)")
        return out
    if short:
        r, m = short[0]
        out["ok"] = True
        out["not_run"] = (f"GPU {r} has {m.get('free_mib')} MiB free beside the live server, the canary needs "
                          f"{m.get('needed_mib')} (canary_min_free_mib): not run, the load will find out")
        out["summary"] = "GPU canary not run: " + out["not_run"]
        return out
    never = [rk for rk in ranks if "nccl_init" not in (rk.get("steps") or {})]
    if never:
        rk = never[0]
        last = _last_step(rk["steps"])
        doing = WHAT[ORDER[ORDER.index(last) + 1] if last else "cuda"]
        how = (f"still in {doing} when the canary's limit of {limit} s ran out" if report.get("timed_out") else
               f"exited {rk.get('exit')} after {WHAT.get(last, 'its start')}: "
               f"{_last_line(rk.get('stderr')) or 'no error printed'}")
        out["refusal"] = (f"GPU {rk['rank']}: its rank never joined the NCCL group ({how}); expected all {world} "
                          "ranks to join: tensor parallelism would wait on it for the whole NCCL timeout")
        return out
    bad_nccl = [rk for rk in ranks if not rk["steps"].get("nccl", {}).get("ok", False)]
    if bad_nccl:
        errs = [rk for rk in bad_nccl if rk["steps"].get("nccl", {}).get("error")]
        if errs:
            rk = errs[0]
            out["refusal"] = (f"GPU {rk['rank']}: the NCCL all-reduce over {world} GPUs failed: "
                              f"{_first_line(rk['steps']['nccl']['error'])}")
        else:
            out["refusal"] = (f"the NCCL all-reduce over {world} GPUs did not finish within {limit} s "
                              f"({len(bad_nccl)} ranks still in it): {P2P_HINT}")
        return out
    for rk in ranks:
        st = rk["steps"]
        if "triton" in st and not st["triton"].get("ok"):
            out["refusal"] = (f"GPU {rk['rank']}: Triton could not compile and run a kernel as the service user: "
                              f"{_first_line(st['triton'].get('error'))} (the server's MLA and sampling kernels "
                              "are Triton's on these GPUs)")
            return out
        for p in rk.get("probes") or []:
            if not p.get("ok"):
                out["refusal"] = (f"GPU {rk['rank']}: the release's kernel {p.get('probe')} failed: "
                                  f"{_first_line(p.get('error'))} (a build with only PTX for these GPUs needs a "
                                  "driver that compiles it: deployer versions)")
                return out
    if report.get("timed_out"):
        out["refusal"] = f"the GPU canary did not finish within {limit} s after its all-reduce (last steps: " + \
            ", ".join(f"GPU {rk['rank']} {_last_step(rk['steps'])}" for rk in ranks) + ")"
        return out
    st0 = ranks[0]["steps"]
    cuda_s = max(rk["steps"]["cuda"].get("seconds") or 0 for rk in ranks)
    probes = [p for p in ranks[0].get("probes") or []]
    out["measured"] = {"seconds": report.get("seconds"), "cuda_init_seconds": cuda_s,
                       "nccl_seconds": max(rk["steps"]["nccl"].get("seconds") or 0 for rk in ranks),
                       "bus_gbps": st0["nccl"].get("bus_gbps"),
                       "triton_seconds": (st0.get("triton") or {}).get("seconds"),
                       "probes": {p.get("probe"): ("skipped" if p.get("skipped") else "ok") for p in probes}}
    ran = [n for n, v in out["measured"]["probes"].items() if v == "ok"]
    skipped = [f"{p.get('probe')} ({_first_line(p.get('skipped'))})" for p in probes if p.get("skipped")]
    bw = out["measured"]["bus_gbps"]
    out["ok"] = True
    out["summary"] = (
        f"GPU canary: {world} GPUs ({st0['cuda'].get('name')}, compute capability {st0['cuda'].get('compute_cap')}) "
        f"initialised in <= {cuda_s} s; NCCL joined and all-reduced {st0['nccl'].get('allreduce_mib')} MiB"
        + (f" at {bw} GB/s bus" if bw else "") + "; "
        + ("Triton compiled and ran a kernel" if st0.get("triton", {}).get("ok") else "no Triton kernel")
        + (f"; the release's kernels ran: {', '.join(ran)}" if ran else "")
        + (f"; not asked (this release has no such API): {', '.join(skipped)}" if skipped else "")
        + f" ({report.get('seconds')} s)")
    return out


PREFIX = "DEPLOYER-CANARY "
# Lines of the server's [Service] section that are not the process's environment or confinement: how systemd starts,
# restarts, stops and logs the server, and its secrets (the canary needs none).  Every other line runs the canary.
NOT_RUN_PROPERTIES = frozenset({
    "Type", "ExecStart", "ExecStartPre", "ExecStartPost", "ExecStop", "ExecStopPost", "ExecReload", "Restart",
    "RestartSec", "TimeoutStartSec", "TimeoutStopSec", "TimeoutSec", "RuntimeMaxSec", "StandardOutput",
    "StandardError", "StandardInput", "SyslogIdentifier", "LoadCredential", "SetCredential", "WatchdogSec"})


def run_properties(unit_text: str) -> list[str]:
    """``systemd-run`` arguments (``-p Key=Value`` ...) for the server unit's [Service] lines that make the process
    what it is: user, working directory, environment file, limits, every hardening line, the devices.  Lines joined
    where they end in a backslash, as systemd joins them."""
    out, section, pending = [], None, ""
    for raw in str(unit_text or "").splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        if section == "Service" and sep and key.strip() not in NOT_RUN_PROPERTIES:
            out += ["-p", f"{key.strip()}={value.strip()}"]
    return out


def read_report(stdout: str) -> dict | None:
    """The canary's one report line (the last that starts with PREFIX), None when there is none."""
    import json
    for line in reversed(str(stdout or "").splitlines()):
        if line.startswith(PREFIX):
            try:
                got = json.loads(line[len(PREFIX):])
            except ValueError:
                return None
            return got if isinstance(got, dict) else None
    return None


def judge(run: dict, world: int) -> dict:
    """``verdict`` of a command's registered result (stdout, stderr, rc)."""
    run = run or {}
    return verdict(read_report(run.get("stdout")), int(world), run.get("rc"), run.get("stderr") or "")
