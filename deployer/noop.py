"""The no-op check (one round trip): is the planned release already live and serving, exactly?  Pure functions over
the plan and one ``deployer_state`` probe; the action plugin ``deployer_noop_check`` wires them."""
from __future__ import annotations

import hashlib

from deployer.identity import line_splitter_sha256, release_id


def expected_release(the_plan: dict, state: dict) -> dict:
    """From the plan and one ``deployer_state`` probe: the release the full deploy would render, with the
    patch fingerprint and patches it would record, and what already differs (``reasons``)."""
    probe = state.get("probe") or {}
    venv = probe.get("venv") or {}
    reasons = []
    fp, patches = None, []
    if not venv.get("installed"):
        reasons.append(f"venv {the_plan['venv']} is not installed")
    elif venv.get("state") == "error":
        reasons.append(f"venv {the_plan['venv']}: {venv.get('error')}")
    elif the_plan["patch_state"] == "present":
        if venv.get("state") == "patched":
            fp, patches = venv.get("fingerprint"), list(venv.get("patches") or [])
        elif venv.get("state") != "native":
            reasons.append(f"venv {the_plan['venv']}: EAGLE-3 patches not applied ({venv.get('state')})")
    elif venv.get("state") not in ("unpatched", "native"):
        reasons.append(f"venv {the_plan['venv']}: carries patches, the plan wants the pristine wheel")
    return {"id": release_id(the_plan, fp), "fingerprint": fp, "patches": patches, "reasons": reasons}


def _sha256_of(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _shipped_differ(files, probe) -> list:
    """The host paths of ``files`` ({path on the host: source here}) whose sha256 on the host is not the source's."""
    have = probe.get("files_sha256") or {}
    return [p for p, src in (files or {}).items() if have.get(p) != _sha256_of(src)]


def noop_check(expected: dict, state: dict, the_plan: dict, unit_sha256: str, env_sha256: str,
               keeper_unit_sha256: str | None = None) -> dict:
    """Pure: is the planned release already live and serving, exactly?  ``unit_sha256``/``env_sha256``: the
    unit and env file the render stage would write, rendered on the controller (``keeper_unit_sha256``: the state
    keeper's unit, when the plan keeps the host's state).  Every check is on the
    host's truth (files, systemd, /health), not on a record of an earlier run."""
    probe = state.get("probe") or {}
    unit = probe.get("unit") or {}
    reasons = list(expected.get("reasons") or [])
    if state.get("lock"):
        reasons.append("a deploy lock is held")
    if state.get("current") != expected["id"]:
        reasons.append(f"live release {state.get('current')}, planned {expected['id']}")
    if the_plan.get("drafter") and not probe.get("drafter_complete"):
        reasons.append("the drafter is not in the store")
    if the_plan.get("drafter") and probe.get("drafter_changed"):
        reasons.append("the drafter changed on the host after it was shipped: " + ", ".join(probe["drafter_changed"]))
    edited = [n for n in probe.get("live_edited") or []     # the unit and env file are compared with the plan below
              if n not in ("vllm.env", f"{the_plan.get('service')}.service")]
    if edited:
        reasons.append("the live release's files were edited after they were rendered: " + ", ".join(edited))
    if not unit_sha256 or {state.get("unit_sha256"), probe.get("live_unit_sha256")} != {unit_sha256}:
        reasons.append("the unit systemd runs differs from the planned one")
    if not env_sha256 or probe.get("live_env_sha256") != env_sha256:
        reasons.append("the live environment file differs from the planned one")
    live = the_plan.get("secrets") or {}
    if live.get("dropin_path") and (probe.get("files_sha256") or {}).get(live["dropin_path"]) != \
            hashlib.sha256(live["dropin"].encode()).hexdigest():
        reasons.append(f"the unit drop-in {live['dropin_path']} (the live secrets) is missing or differs")
    if probe.get("secrets_current") is False:
        reasons.append("the live secrets differ from the ones given (rotated?): they are written and the server "
                       "restarted")
    wrapper = (the_plan.get("unit") or {}).get("line_splitter")
    if wrapper and (probe.get("files_sha256") or {}).get(wrapper) != line_splitter_sha256():
        reasons.append(f"the log-line wrapper {wrapper} is missing or differs from the planned one")
    keeper = the_plan.get("state_keeper") or {}
    changed = _shipped_differ(keeper.get("files"), probe)
    if changed or (keeper and (probe.get("files_sha256") or {}).get(keeper["unit_path"]) != keeper_unit_sha256):
        reasons.append("the host's state keeper is missing or differs: %s" % (", ".join(changed[:3])
                                                                             or keeper.get("unit_path")))
    gate = the_plan.get("gpu_gate") or {}
    changed = _shipped_differ(gate.get("files"), probe)
    if changed or (gate and (probe.get("files_sha256") or {}).get(gate["dropin_path"]) !=
                   hashlib.sha256(gate["dropin"].encode()).hexdigest()):
        reasons.append("the GPU health gate is missing or differs: %s" % (", ".join(changed[:3])
                                                                          or gate.get("dropin_path")))
    if (unit.get("ActiveState"), unit.get("SubState"), unit.get("NeedDaemonReload")) != ("active", "running", "no"):
        reasons.append("the server is {}/{}{}".format(unit.get("ActiveState"), unit.get("SubState"),
                                                     " (unit changed on disk)" if unit.get("NeedDaemonReload") == "yes"
                                                     else ""))
    if probe.get("health") != 200:
        reasons.append(f"/health answered {probe.get('health')}")
    return {"noop": not reasons, "release": expected["id"], "fingerprint": expected["fingerprint"],
            "patches": expected["patches"], "reasons": reasons}
