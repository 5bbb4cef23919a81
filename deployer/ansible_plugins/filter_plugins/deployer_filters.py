"""Jinja filters for the roles.  Thin wrappers: the logic lives in the deployer package.

Plain ``ansible-playbook`` runs these from whatever Python has ansible-core, which need not
have this package installed: the repository that holds this file is put on ``sys.path``
(the package's pure modules need only the standard library).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

try:
    import deployer  # noqa: F401  (installed, or already importable)
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from ansible.errors import AnsibleFilterError  # noqa: E402

from deployer import (  # noqa: E402
    canary,
    controller_id,
    drafter,
    engines,
    host_checks,
    identity,
    live_secrets,
    plan,
    settings_check,
    versions,
)
from deployer.engines import argv  # noqa: E402
from deployer.host.module_utils import formats, spec_metrics  # noqa: E402


def parse_gpu_csv(text):
    """``nvidia-smi --query-gpu=name,memory.total,driver_version[,memory.used[,compute_cap[,mig.mode.current]]]
    --format=csv,noheader`` -> dicts (``mig``: Enabled, Disabled, or [N/A] on a GPU without MIG)."""
    gpus = []
    for line in (text or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[0]:
            continue
        mem = parts[1].split()[0] if parts[1] else "0"
        used = parts[3].split()[0] if len(parts) > 3 and parts[3] else "0"
        gpus.append({"name": parts[0], "memory_mib": int(mem) if mem.isdigit() else 0, "driver": parts[2],
                     "used_mib": int(used) if used.isdigit() else 0,
                     "compute_cap": parts[4] if len(parts) > 4 else "",
                     "mig": parts[5] if len(parts) > 5 else ""})
    return gpus


def sm120_refusals(the_plan, gpus):
    """What in the plan's launch cannot run on these GPUs (e.g. SGLang attention backends on sm_120): messages,
    from the plan's engine (deployer/engines)."""
    eng = engines.get(((the_plan or {}).get("engine") or {}).get("name") or (the_plan or {}).get("backend") or "vllm")
    return eng.sm120_refusals(the_plan["argv"], [g.get("compute_cap", "") for g in gpus or []])


def disk_shortfalls(measured, needs, margin_gib=0):
    """What does not fit, one message per filesystem.  ``measured``: lines ``<st_dev> <free KiB> <path>``, one per
    item of ``needs`` (``{what, path, bytes}``: what will be written where; ``always``: check that filesystem even
    when nothing is written to it - the deploy root's, where journals and caches grow), in the same order.  Needs on
    the same filesystem add up; the margin is kept free on each filesystem checked."""
    by_dev, order = {}, []
    for line, need in zip(measured, needs, strict=True):   # one measurement per need, or the check is wrong
        dev, free_kib, _where = (str(line).split(None, 2) + ["", "", ""])[:3]
        if dev not in by_dev:
            by_dev[dev] = {"free": int(free_kib or 0) * 1024, "parts": [], "paths": [], "always": False}
            order.append(dev)
        fs = by_dev[dev]
        fs["parts"].append((need["what"], int(need.get("bytes") or 0)))
        fs["always"] |= bool(need.get("always"))
        if need.get("bytes") or need.get("always"):
            fs["paths"].append(need["path"])
    out, margin = [], int(float(margin_gib) * (1 << 30))
    for dev in order:
        fs = by_dev[dev]
        wanted = sum(b for _w, b in fs["parts"])
        if (wanted or fs["always"]) and fs["free"] < wanted + margin:
            parts = " + ".join([f"{w} {_gib(b)}" for w, b in fs["parts"] if b] + [f"margin {_gib(margin)}"])
            out.append(f"free disk on the filesystem of {' and '.join(fs['paths'])}: measured {_gib(fs['free'])}, "
                       f"expected >= {_gib(wanted + margin)} ({parts}; in bytes {fs['free']} < {wanted + margin})")
    return out


def _gib(n):
    return f"{n / (1 << 30):.1f} GiB" if n >= (1 << 30) or n == 0 else f"{n / (1 << 20):.1f} MiB"


def version_tuple(v):
    """A version as a list of numbers for comparison (deployer.versions.vtuple: the one parser)."""
    return list(versions.vtuple(v))


def _trace(what):
    """DEPLOYER_TRACE_FILE (deployer/runner.py, bench/profile.py): one line each time a plan is made, so a test can
    count that a run makes it once (bench/profile.py reads only lines with a task's start and end)."""
    path = os.environ.get("DEPLOYER_TRACE_FILE")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"plan": what, "pid": os.getpid()}) + "\n")


def deployer_plan(settings, drafter_manifest=None):
    """The whole deploy plan for one host (deployer.plan.make_plan); errors name setting, value, expectation."""
    _trace("made")
    try:
        return plan.make_plan(settings, drafter_manifest or None)
    except plan.PlanError as e:
        raise AnsibleFilterError(str(e)) from e


def deployer_plan_or_none(settings, drafter_manifest=None):
    """The plan, or None when the settings are bad (the full path's preflight then reports them).  Called by the
    no-op task (action_plugins/deployer_noop_check.py), not a filter."""
    _trace("made")
    try:
        return plan.make_plan(settings, drafter_manifest or None)
    except (plan.PlanError, TypeError, ValueError, KeyError):
        return None


def deployer_plan_devices(the_plan, device_allow, strict=True):
    """The plan bound to the device classes the host measured (deployer.plan.with_devices).  ``strict=False`` (the
    no-op check): None for a bad entry, which the full deploy's preflight then reports."""
    try:
        return plan.with_devices(the_plan, device_allow)
    except plan.PlanError as e:
        if not strict:
            return None
        raise AnsibleFilterError(str(e)) from e


def nvidia_device_allow(names, extra=None):
    """``/proc/devices`` NVIDIA class names -> systemd ``DeviceAllow=`` entries, plus the operator's extras."""
    return ["char-%s rw" % n for n in (names or [])] + list(extra or [])


def lock_stale(lock_result, me=None):
    """Why the lock in the way is stale ("" when it may be live): older than the time-to-live it declared (the
    host said so: ``expired``), or taken on this controller (``me``: controller_identity) by a process that is
    certainly gone (deployer.controller_id.holder_state)."""
    if not (lock_result or {}).get("locked"):
        return ""
    holder = lock_result.get("holder") or {}
    if lock_result.get("expired"):
        return "older than its time-to-live (%s s)" % holder.get("ttl_seconds", "?")
    state, why = controller_id.holder_state(holder, me if isinstance(me, dict) else None)
    return why if state == "gone" else ""


def release_plan(manifest, settings):
    """The plan of a release already on the host, from its manifest (deployer.plan.release_plan)."""
    try:
        return plan.release_plan(manifest, settings)
    except plan.PlanError as e:
        raise AnsibleFilterError(str(e)) from e


def drafter_fit(target_config, drafter_src_dir, engine):
    """deployer.drafter_fit.check on the target's config.json and the drafter on this controller; a drafter that
    cannot be read is one refusal naming why."""
    from deployer import drafter_fit as fit
    engine = engine or {}
    try:
        cfg, shapes = fit.read_drafter(drafter_src_dir)
        return fit.check(target_config or {}, cfg, shapes, engine.get("name", "vllm"),
                         str(engine.get("version", "")))
    except Exception as e:      # a hostile config (nested past recursion, fields of any type): refused, said
        return {"refusals": ["drafter %s: %s: %s" % (drafter_src_dir, type(e).__name__, str(e)[:300])],
                "warnings": [], "captured": [], "source": "", "fc_in": None}


def memory_plan(the_plan, gpus, shard_check, model_config_text, drafter_src_dir="", overhead_gib=5.0):
    """deployer.memory_plan.plan for this plan's argv on these GPUs (the smallest one), from the shards' tensor bytes
    (preflight_facts' shard_check) and the model's config.json; None when the plan's engine plans no GPU memory (SGLang,
    vLLM's CPU build).  A config the arithmetic cannot read is a refusal naming why."""
    from deployer import memory_plan as mp
    eng = engines.get(((the_plan or {}).get("engine") or {}).get("name") or "vllm")
    if not eng.memory_plan or not gpus:
        return None
    argv = the_plan["argv"]
    groups = (shard_check or {}).get("tensor_groups")
    if not groups or not isinstance(groups, dict):     # 0 bytes of weights is a misread, never a plan that fits
        return {"fits": False, "message": "memory plan: no tensor sizes were read from the shards' headers "
                                          "(measured %r)" % (groups,)}

    def num(flags, kind, default=None):
        v = engines.argv_value(argv, *flags)
        return default if v is None else kind(v)

    try:
        cfg = json.loads(model_config_text or "")
        from deployer import drafter_fit as fit
        drafter_cfg, drafter_bytes = None, 0
        if the_plan.get("speculative") and drafter_src_dir:
            drafter_cfg = json.loads((Path(drafter_src_dir) / "config.json").read_text())
            drafter_bytes = fit.tensor_bytes(drafter_src_dir)
        return mp.plan(gpu_mib=min(int(g["memory_mib"]) for g in gpus),
                       gmu=num(["--gpu-memory-utilization"], float, 0.9),
                       tp=num(["--tensor-parallel-size", "-tp"], int, 1),
                       max_model_len=num(["--max-model-len"], int), max_num_seqs=num(["--max-num-seqs"], int),
                       groups=groups, model_config=cfg,
                       drafter_config=drafter_cfg, drafter_bytes=drafter_bytes,
                       overhead_gib=float(overhead_gib),
                       kv_cache_dtype=engines.argv_value(argv, "--kv-cache-dtype") or "auto")
    except Exception as e:      # whatever a hostile config.json or index makes of it (issue 53 N12): refused, said
        return {"fits": False, "message": "memory plan: cannot read what it needs (%s: %s)"
                % (type(e).__name__, str(e)[:300])}


def driver_floor(read, engine, gpu_floor="0"):
    """deployer.driver_floor.floor on what the cuda_floor module read, each library labelled with what the engine
    says it holds (plan.engine.cuda_libraries)."""
    from deployer import driver_floor as df
    labels = (engine or {}).get("cuda_libraries") or {}
    libs = [dict(lib, label=labels.get(lib.get("pattern"), "")) for lib in (read or {}).get("libraries") or []]
    return df.floor(libs, (read or {}).get("torch_cuda"), str(gpu_floor))


def driver_refusal(floor, driver):
    from deployer import driver_floor as df
    return df.refusal(floor, str(driver))


def driver_note(floor, driver):
    from deployer import driver_floor as df
    return df.note(floor, str(driver))


def haproxy_word(value, what="HAProxy config word"):
    """A value for haproxy.cfg, refused unless it is a plain token (formats.haproxy_word)."""
    try:
        return formats.haproxy_word(value, what)
    except formats.FormatError as e:
        raise AnsibleFilterError(str(e)) from e


def release_id(the_plan, patch_fingerprint=None):
    return identity.release_id(the_plan, patch_fingerprint)


def drafter_manifest(src_dir, strict=True):
    """Content manifest of the drafter checkpoint on the controller; see deployer.drafter.  ``strict=False``
    (the no-op check) returns None for a bad directory: the full deploy's preflight then reports it."""
    _trace("drafter hashed")
    try:
        return drafter.tree_manifest(src_dir)
    except Exception:
        if strict:
            raise
        return None


def audit_append(line, root):
    """The one shell command that appends an audit line (JSON text) to ``<root>/audit.jsonl`` where no module runs
    (tasks/finish.yml's raw task, the no-op check's own append): created 0600, and an older 0644 one made 0600 as the
    lock module does (docs/security.md rule 18)."""
    import shlex
    path = shlex.quote("%s/audit.jsonl" % str(root).rstrip("/"))
    return "umask 077; printf '%%s\\n' %s >> %s && chmod 0600 %s" % (shlex.quote(str(line)), path, path)


class FilterModule(object):
    def filters(self):
        return {
            "deployer_plan": deployer_plan,
            "deployer_plan_devices": deployer_plan_devices,
            "release_id": release_id,
            "lock_stale": lock_stale,
            "unknown_settings": settings_check.unknown,
            "nvidia_device_allow": nvidia_device_allow,
            "systemd_exec_start": argv.exec_start,
            "sm120_refusals": sm120_refusals,
            "systemd_env_quote": argv.systemd_env_quote,
            "haproxy_word": haproxy_word,
            "drafter_fit": drafter_fit,
            "memory_plan": memory_plan,
            "missing_nvidia_nodes": host_checks.missing_nodes,
            "p2p_risks": host_checks.p2p_risks,
            "toolchain_refusal": host_checks.toolchain_refusal,
            "driver_floor": driver_floor,
            "driver_note": driver_note,
            "driver_refusal": driver_refusal,
            "canary_verdict": canary.judge,
            "unit_run_properties": canary.run_properties,
            "deployer_engine": engines.describe,
            "engine_of_unit": engines.engine_of_unit,
            "deployer_secret_files": live_secrets.secret_files,
            "deployer_release_plan": release_plan,
            "parse_gpu_csv": parse_gpu_csv,
            "version_tuple": version_tuple,
            "disk_shortfalls": disk_shortfalls,
            "drafter_manifest": drafter_manifest,
            "spec_decode_stats": spec_metrics.spec_decode_stats,
            "spec_decode_delta": spec_metrics.spec_decode_delta,
            "audit_append": audit_append,
        }
