"""The deploy plan: one pure function from the operator's settings to everything the stages need.

Preflight computes it once per host (filter ``deployer_plan``) and every later stage reads only
the plan (and its own documented inputs), never another stage's variables.  Fields:

==================  ==================================================================================
backend             serving engine ("vllm")
vllm_version        the pinned release
venv, python        ``<root>/venvs/vllm-<version>`` (``-unpatched`` when patches are off: a release that
                    asks for the pristine wheel never touches the patched venv a live release runs)
patch_state         "present" (apply what this vLLM needs) or "absent"
service, unit_path  systemd unit name and path
port                serving port (loopback checks use it)
served_model_name   the ``model`` clients send
model_dir           checkpoint directory on the host
speculative         EAGLE-3 on or off
drafter             None, or {src, files, tree_sha256, bytes, store_dir, dir, staging_dir}: the controller's
                    manifest and the content-addressed place on the host
argv                the full ``vllm serve`` argv, launcher first (built by deployer.serve, nowhere else)
env                 the non-secret environment of the server (secrets go only to the 0600 env file)
restart_delay_seconds  systemd RestartSec
release_inputs      everything that names a release (hashed with the patch fingerprint into its id)
dirs                root, releases, current, previous, drafters, bin, cache
==================  ==================================================================================
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from deployer import serve

BACKENDS = ("vllm",)
SECRET_KEYS = ("api_key", "hf_token")


class PlanError(ValueError):
    """Bad deploy input; the message names the setting, the value and what is expected."""


def content_hash(value: Any, length: int = 12) -> str:
    """Stable short hash of any JSON-able value (release ids, env hashes)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:length]


def _need(s: dict, key: str) -> Any:
    if key not in s:
        raise PlanError(f"plan: setting {key!r} missing")
    return s[key]


def make_plan(settings: dict, drafter_manifest: dict | None = None) -> dict:
    """``settings``: the ``deployer_*`` variables without the prefix (see roles/deployer/defaults)."""
    s = dict(settings)
    backend = s.get("backend", "vllm")
    if backend not in BACKENDS:
        raise PlanError(f"backend: got {backend!r}, expected one of {list(BACKENDS)}")
    root = str(_need(s, "root")).rstrip("/")
    if not root.startswith("/"):
        raise PlanError(f"root: got {root!r}, expected an absolute path")
    version = str(_need(s, "vllm_version"))
    patched = bool(s.get("patch_enabled", True))
    venv = f"{root}/venvs/vllm-{version}" + ("" if patched else "-unpatched")
    service = str(_need(s, "service_name"))
    speculative = bool(s.get("speculative_enabled", True))
    dirs = {"root": root, "releases": f"{root}/releases", "current": f"{root}/current",
            "previous": f"{root}/previous", "drafters": f"{root}/drafters", "bin": f"{root}/bin",
            "cache": f"{root}/cache"}

    drafter = None
    if speculative:
        if not drafter_manifest or not drafter_manifest.get("tree_sha256"):
            raise PlanError("speculative decoding is on but there is no drafter manifest "
                            "(set deployer_drafter_src_dir to the drafter checkpoint on this machine)")
        short = drafter_manifest["tree_sha256"][:16]
        drafter = dict(drafter_manifest, store_dir=dirs["drafters"], dir=f"{dirs['drafters']}/{short}",
                       staging_dir=f"{dirs['drafters']}/.incoming-{short}")

    launcher = s.get("launcher") or [f"{venv}/bin/vllm"]
    try:
        argv = serve.build_serve_argv({
            "launcher": [a.replace("{python}", f"{venv}/bin/python") for a in launcher],
            "model": s.get("model_dir"),
            "served_model_name": s.get("served_model_name"),
            "host": s.get("host", "0.0.0.0"),
            "port": s.get("port"),
            "tensor_parallel_size": s.get("tensor_parallel_size"),
            "gpu_memory_utilization": s.get("gpu_memory_utilization"),
            "max_model_len": s.get("max_model_len") or None,
            "trust_remote_code": bool(s.get("trust_remote_code", True)),
            "speculative": ({"method": "eagle3", "model": drafter["dir"],
                             "num_speculative_tokens": s.get("num_speculative_tokens", 3),
                             "extra": s.get("speculative_extra") or {}} if drafter else {}),
            "extra_args": s.get("extra_args") or [],
        })
    except serve.ServeConfigError as e:
        raise PlanError(str(e)) from e

    env = {"VLLM_ENGINE_READY_TIMEOUT_S": str(int(s.get("engine_ready_timeout_seconds", 2400)))}
    for k, v in sorted({**(s.get("nccl_env") or {}), **(s.get("env_extra") or {})}.items()):
        if not isinstance(k, str) or not k.replace("_", "a").isalnum() or k[0].isdigit():
            raise PlanError(f"environment variable name: got {k!r}, expected [A-Za-z_][A-Za-z0-9_]*")
        if k in ("VLLM_API_KEY", "HF_TOKEN"):
            raise PlanError(f"environment: {k} is a secret; set deployer_api_key / deployer_hf_token instead")
        env[k] = str(v)
    secrets_hash = hashlib.sha256("\0".join(str(s.get(k) or "") for k in SECRET_KEYS).encode()).hexdigest()
    restart_delay = int(s.get("restart_delay_seconds", 30))

    return {
        "backend": backend, "vllm_version": version, "venv": venv, "python": f"{venv}/bin/python",
        "patch_state": "present" if patched else "absent",
        "service": service, "unit_path": f"/etc/systemd/system/{service}.service",
        "port": s.get("port"), "served_model_name": s.get("served_model_name"), "model_dir": s.get("model_dir"),
        "speculative": speculative, "drafter": drafter, "argv": argv, "env": env,
        "restart_delay_seconds": restart_delay, "dirs": dirs,
        "release_inputs": {"argv": argv, "vllm": version, "drafter": drafter["tree_sha256"] if drafter else None,
                           "env": env, "secrets": secrets_hash, "restart_delay": restart_delay},
    }


def release_id(plan: dict, patch_fingerprint: str | None) -> str:
    """A release is named by the hash of everything that defines it: an unchanged deploy renders the
    same release, changes nothing and restarts nothing."""
    return content_hash(dict(plan["release_inputs"], patch=patch_fingerprint))
