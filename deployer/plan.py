"""The deploy plan: one pure function from the operator's settings to everything the stages need.

Preflight computes it once per host (filter ``deployer_plan``) and every later stage reads only
the plan (and its own documented inputs), never another stage's variables.  Fields:

==================  ==================================================================================
backend             serving engine: "vllm" or "sglang" (docs/backends.md)
engine              {name, label, package, version}: what the install stage installs and the records name
vllm_version        the pinned vLLM release (None for SGLang)
venv, python        ``<root>/venvs/vllm-<version>-p<engine>`` when patched (one venv per vLLM version AND patch
                    engine: a changed engine gets a new venv, so a rollback runs exactly the code its release
                    was verified with); ``<root>/venvs/vllm-<version>`` is the pristine wheel (patches off);
                    ``<root>/venvs/sglang-<version>`` for SGLang (never patched); ``-x<hash>`` after it when the
                    install pins packages of its own (venv_suffix)
patch_state         "present" (apply what this vLLM needs) or "absent" (also every SGLang plan)
credentials         files systemd hands the service (LoadCredential=): {name: file in the live secrets dir};
                    SGLang's API key lives there (it has no environment variable for it, and argv is world-readable)
secrets             the live secrets: {dir, env_file, dropin_path, dropin} (live_secrets); never part
                    of a release (its id, its files): a rollback keeps the live ones
service, unit_path  systemd unit name and path
user                the unprivileged system user the server runs as (never root)
unit                what the unit needs beyond argv/env: user, writable paths, device allow-list (docs/hardening.md),
                    the log-line wrapper's path (None: the engine is the main process)
api_protected       clients must send the API key (or the server listens on loopback only)
api_exposure        what the server answers, and to whom (Engine.exposure: the API guard, the key, the bind)
port                serving port (loopback checks use it)
extra_args_count    how many words at the argv's end are the operator's extra_args (the verify stage asks the
                    engine's own parser that they set no managed flag)
probe_host          where the host's own checks reach the server: the bound address, loopback when it binds all
probe_url           ``http://<probe_host>:<port>`` (IPv6 in brackets): health, watch and smoke ask this
served_model_name   the ``model`` clients send
model_dir           checkpoint directory on the host
speculative         EAGLE-3 on or off
draft_tokens_per_step  the drafts one verify step proposes (0 without EAGLE-3): the smoke's acceptance rate
drafter             None, or {src, files, tree_sha256, bytes, store_dir, dir, staging_dir}: the controller's
                    manifest and the content-addressed place on the host
argv                the full ``vllm serve`` argv, launcher first (built by the engine's own argv module, nowhere else)
env                 the non-secret environment of the server (secrets go only to the live 0600 secrets files)
restart_delay_seconds  systemd RestartSec
state_keeper        None, or the host's state keeper: {dir (content-named, root's bin/), files {host path: source},
                    textfile_dir, unit, unit_path} (roles/render writes them; the engine's unit Wants= it)
release_inputs      everything that names a release (hashed with the patch fingerprint into its id)
dirs                root, releases, current, previous, drafters, bin, cache (root's: uv), server_cache (the
                    service user's home: torch.compile, Triton, Hugging Face and XDG caches, shared by releases)
server_cache_dirs   the folders of server_cache the environment names (the engine's caches among them): made by
                    the install stage, owned by the service user
==================  ==================================================================================
"""
from __future__ import annotations

import hashlib
import ipaddress
import posixpath
import re
from typing import Any

from deployer import engines, versions
from deployer.engines.argv import ServeConfigError, systemd_exec_quote
from deployer.host.module_utils import formats
from deployer.identity import (
    api_guard_module,
    gpu_gate_files,
    line_splitter_path,
    state_keeper_files,
    templates_hash,
)
from deployer.live_secrets import live_secrets

SECRET_KEYS = ("api_key", "hf_token")
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"   # what a unit without PATH= gets (systemd.exec)
_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,30}$")
# A unit name that is a plain file name in /etc/systemd/system and a plain shell word (systemd.unit(5) allows
# more; the deployer needs no more).  A release like 0.16.0, 0.11.2.post1 or 0.20.0rc1: a path component too.
_SERVICE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_DEVICE_RE = re.compile(r"^(char-[A-Za-z0-9_.-]+|/dev/[A-Za-z0-9_./-]+)( [rwm]{1,3})?$")


class PlanError(ValueError):
    """Bad deploy input; the message names the setting, the value and what is expected."""


# The host's state keeper's unit (templates/state-keeper.service.j2): one per host, whatever the engine's unit is named
KEEPER_UNIT = "deployer-state"
GPU_GATE_DROPIN = "deployer-gpu-gate.conf"


def is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def probe_host(bind: str) -> str:
    """Where the host's own checks (health, watch, smoke) reach the server: the address it binds, or loopback of
    the same family when it binds them all (module_utils/host_probe.probe_address: the host side's rule too)."""
    from deployer.host.module_utils.host_probe import probe_address
    return probe_address(bind)


def probe_url(probe: str, port) -> str:
    """``http://<probe_host>:<port>`` (an IPv6 address in brackets): where health, watch and smoke ask."""
    return f"http://{'[' + probe + ']' if ':' in probe else probe}:{port}"


def _a(word: str) -> str:
    return ("an " if word[:1] in "aeiou" else "a ") + word


def deploy_dirs(root: str) -> dict:
    """The deploy root's layout (plan field ``dirs``)."""
    return {"root": root, "releases": f"{root}/releases", "current": f"{root}/current",
            "previous": f"{root}/previous", "drafters": f"{root}/drafters", "bin": f"{root}/bin",
            "cache": f"{root}/cache", "server_cache": f"{root}/cache/server", "secrets": f"{root}/secrets"}


def _cache_dirs(server_cache: str, paths) -> list[str]:
    """The folders of ``server_cache`` that ``paths`` (the environment's values) lie in, by their normal form: a
    path that leaves it (``..``) names none, so root never makes a folder for the service user outside its home."""
    names = set()
    for v in paths:
        n = posixpath.normpath(v) if v.startswith("/") else ""
        if n.startswith(server_cache + "/"):
            names.add(n[len(server_cache) + 1:].split("/")[0])
    return sorted(names)


def _need(s: dict, key: str) -> Any:
    if key not in s:
        raise PlanError(f"plan: setting {key!r} missing")
    return s[key]


def venv_suffix(packages) -> str:
    """What the install's own pins (install_overrides, install_extra_packages) add to the venv's name: nothing without
    any, else ``-x`` and 8 hex digits of them (order aside).  A changed pin is a new venv; the live release's venv,
    which a rollback runs, is never reinstalled under it."""
    if not packages:
        return ""
    if not isinstance(packages, list) or not all(isinstance(p, str) for p in packages):
        raise PlanError(f"install_overrides / install_extra_packages: got {packages!r}, expected lists of strings")
    return "-x" + hashlib.sha256("\n".join(sorted(set(packages))).encode()).hexdigest()[:8]


def make_plan(settings: dict, drafter_manifest: dict | None = None) -> dict:
    """``settings``: the ``deployer_*`` variables without the prefix (see roles/deployer/defaults)."""
    s = dict(settings)
    backend = _need(s, "backend")
    try:
        eng = engines.get(backend)
    except engines.EngineError as e:
        raise PlanError(str(e)) from e
    # what registration checked, again for the engine as it is now: an unknown log or metric rule set would read
    # its load and its drafts as nothing
    bad = engines.problems(type(eng))
    if bad:
        raise PlanError(f"engine {eng.name}: " + "; ".join(bad))
    root = str(_need(s, "root")).rstrip("/")
    if not re.fullmatch(r"/[A-Za-z0-9_./-]*", root) or ".." in root.split("/"):
        raise PlanError(f"root: got {root!r}, expected an absolute path of letters, digits and _ . / -")
    for key in SECRET_KEYS:
        value = s.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise PlanError(f"{key}: got {_a(type(value).__name__)}, expected a string (a secret keeps its type: "
                            "quote it in YAML, e.g. deployer_{key}: \"0777\", or set it from the environment)")
        bad = formats.control_char(value)
        if bad:
            raise PlanError(f"{key}: contains the control character {bad}; an env file line ends there")
    _need(s, eng.version_setting)
    try:
        version = eng.version(s)
    except engines.EngineError as e:
        raise PlanError(str(e)) from e
    venv, patched = eng.venv(s, root, version)
    venv += venv_suffix(s.get("install_packages"))
    service = str(_need(s, "service_name"))
    if not _SERVICE_RE.fullmatch(service):
        raise PlanError(f"service_name: got {service!r}, expected a unit name without .service: a letter or digit "
                        "then up to 63 of [A-Za-z0-9_-] (it becomes a file name and a shell word)")
    speculative = bool(_need(s, "speculative_enabled"))
    dirs = deploy_dirs(root)
    user = str(_need(s, "service_user"))
    if not _USER_RE.fullmatch(user) or user == "root":
        raise PlanError(f"service_user: got {user!r}, expected a system user name other than root "
                        "([a-z_][a-z0-9_-]*, at most 31 characters)")
    bind = str(_need(s, "host"))
    api_protected = bool(s.get("api_key")) or is_loopback(bind)
    if not api_protected and not s.get("allow_unauthenticated"):
        raise PlanError(f"host: got {bind!r} with no API key: the API would be open to the network. Set "
                        "deployer_api_key (or DEPLOYER_API_KEY), bind deployer_host: 127.0.0.1, or set "
                        "deployer_allow_unauthenticated: true to accept an open API")
    writable = [str(p) for p in (s.get("writable_paths") or [])]
    for p in writable:
        if not re.fullmatch(r"-?/[^\s\0]*", p) or ".." in p.split("/") or formats.control_char(p):
            raise PlanError(f"writable_paths: got {p!r}, expected absolute paths (a leading '-' means optional)")
    drafter = None
    if speculative:
        if not drafter_manifest or not drafter_manifest.get("tree_sha256"):
            raise PlanError("speculative decoding is on but there is no drafter manifest "
                            "(set deployer_drafter_src_dir to the drafter checkpoint on this machine)")
        short = drafter_manifest["tree_sha256"][:16]
        drafter = dict(drafter_manifest, store_dir=dirs["drafters"], dir=f"{dirs['drafters']}/{short}",
                       staging_dir=f"{dirs['drafters']}/.incoming-{short}")

    credentials = eng.credentials(s)
    try:
        argv = eng.argv(s, venv, drafter, credentials)
        why = eng.refusal(version, speculative, drafter, s) or versions.measured_refusal(eng.label, version)
        if why:
            raise PlanError(why)
        for word in argv:      # every word reaches the unit's ExecStart= line (formats.unit_word)
            systemd_exec_quote(word)
    except ServeConfigError as e:
        raise PlanError(str(e)) from e

    sc = dirs["server_cache"]
    # every cache the engine writes lives in the service user's home, shared by releases (warm restarts)
    env = {"TRITON_CACHE_DIR": f"{sc}/triton", "HF_HOME": f"{sc}/huggingface", "XDG_CACHE_HOME": f"{sc}/xdg"}
    if eng.jit_toolchain:   # the tools its JIT runs by name: the venv's first, then systemd's own default PATH
        env["PATH"] = f"{venv}/bin:{SYSTEMD_PATH}"
    try:
        env.update(eng.env(s, sc))
    except engines.EngineError as e:
        raise PlanError(str(e)) from e
    for k, v in sorted({**(s.get("nccl_env") or {}), **(s.get("env_extra") or {})}.items()):
        if not isinstance(k, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):   # systemd's own rule
            raise PlanError(f"environment variable name: got {k!r}, expected [A-Za-z_][A-Za-z0-9_]*")
        if k in ("VLLM_API_KEY", "HF_TOKEN", "SGLANG_API_KEY"):
            raise PlanError(f"environment: {k} is a secret; set deployer_api_key / deployer_hf_token instead")
        bad = formats.control_char(str(v))
        if bad:
            # the value is never echoed: an undeclared secret (WANDB_API_KEY, a token) may be one (issue 53 N13)
            raise PlanError(f"environment: the value of {k} contains the control character {bad}; an env file line "
                            "ends there")
        env[k] = str(v)
    if eng.api_guard and env.get("PYTHONPATH") != eng.env(s, sc).get("PYTHONPATH"):
        raise PlanError(f"environment: PYTHONPATH is the deployer's ({eng.env(s, sc).get('PYTHONPATH')}: where "
                        f"{eng.label} imports the API guard, docs/security.md); got {env.get('PYTHONPATH')!r}")
    restart_delay = int(_need(s, "restart_delay_seconds"))
    line_splitter = _need(s, "log_line_splitter")
    if not isinstance(line_splitter, bool):
        raise PlanError(f"log_line_splitter: got {line_splitter!r}, expected true or false")
    wrapper = line_splitter_path(dirs["bin"]) if line_splitter else None
    keeper = None
    if _need(s, "state_keeper"):
        textfile_dir = str(_need(s, "metrics_textfile_dir"))
        if not re.fullmatch(r"/[A-Za-z0-9_./-]*", textfile_dir) or ".." in textfile_dir.split("/"):
            raise PlanError(f"metrics_textfile_dir: got {textfile_dir!r}, expected an absolute path of letters, "
                            "digits and _ . / -")
        kdir, kfiles = state_keeper_files(dirs["bin"])
        keeper = {"dir": kdir, "files": {k: str(v) for k, v in kfiles.items()}, "textfile_dir": textfile_dir,
                  "unit_path": f"/etc/systemd/system/{KEEPER_UNIT}.service", "unit": KEEPER_UNIT}

    # the GPU health gate before every start (a drop-in: not a release input, so turning it on or off restarts nothing;
    # off, the drop-in says so and runs nothing)
    gdir, gfiles = gpu_gate_files(dirs["bin"])
    since = s.get("gpu_health_since_epoch") or 0
    if not isinstance(since, int) or isinstance(since, bool) or since < 0:
        raise PlanError(f"preflight_gpu_health_since_epoch: got {since!r}, expected seconds since the epoch (0: since "
                        "boot)")
    gate = {"dir": gdir, "files": {k: str(v) for k, v in gfiles.items()},
            "dropin_path": f"/etc/systemd/system/{service}.service.d/{GPU_GATE_DROPIN}",
            "dropin": ("# Managed by deployer: the GPU health gate before every start of the engine "
                       "(roles/render/files/gpu_gate).\n"
                       + ("[Service]\nExecStartPre=+/usr/bin/python3 "
                          + " ".join(systemd_exec_quote(w) for w in
                                     ["-I", f"{gdir}/gpu_gate.py", "--service", service, "--since-epoch", str(since)])
                          + "\n" if s.get("gpu_gate") else "# off (preflight_gpu_health: false)\n"))}

    probe = probe_host(bind)
    return with_devices({
        "backend": backend, "engine": eng.describe(version),
        "extra_args_count": len(s.get(eng.extra_args_setting) or []),
        "probe_host": probe, "probe_url": probe_url(probe, s.get("port")),
        "vllm_version": version if eng.version_setting == "vllm_version" else None, "venv": venv,
        "python": f"{venv}/bin/python",
        "credentials": credentials,
        "patch_state": "present" if patched else "absent",
        "service": service, "unit_path": f"/etc/systemd/system/{service}.service", "user": user,
        "unit": {"user": user, "writable_paths": [sc] + writable, "device_allow": [],
                 "line_splitter": wrapper,
                 "api_guard": api_guard_module(dirs["bin"])[0] if eng.guarded(argv) else None},
        "api_protected": api_protected,
        "api_exposure": eng.exposure(argv, bool(s.get("api_key")), is_loopback(bind)),
        "port": s.get("port"), "served_model_name": s.get("served_model_name"), "model_dir": s.get("model_dir"),
        "speculative": speculative, "drafter": drafter, "argv": argv, "env": env,
        "draft_tokens_per_step": eng.draft_tokens_per_step(s) if speculative else 0,
        "restart_delay_seconds": restart_delay, "dirs": dirs, "state_keeper": keeper, "gpu_gate": gate,
        # the caches the environment points into the server cache: the install stage makes them, the user's own
        "server_cache_dirs": _cache_dirs(sc, env.values()),
        "secrets": live_secrets(dirs, service),
        "release_inputs": {"argv": argv, "engine": backend, "version": version,
                           "drafter": drafter["tree_sha256"] if drafter else None,
                           "env": env, "restart_delay": restart_delay, "state_keeper": keeper is not None,
                           "user": user, "writable": writable, "devices": [], "templates": templates_hash(),
                           "line_splitter": wrapper},
    }, s.get("device_allow"))


def with_devices(the_plan: dict, device_allow: list | None) -> dict:
    """The plan bound to what the host measured: the device classes its unit may open (``DeviceAllow=``, a release
    input).  The only part of a plan that depends on a host read, so a run makes the plan once (the no-op check,
    before the lock) and binds it to each read (the no-op's, preflight's under the lock)."""
    devices = [str(d) for d in (device_allow or [])]
    for d in devices:
        if not _DEVICE_RE.fullmatch(d):
            raise PlanError(f"device_allow: got {d!r}, expected 'char-<name from /proc/devices> rw' or "
                            "'/dev/<node> rw'")
    return dict(the_plan, unit=dict(the_plan["unit"], device_allow=devices),
                release_inputs=dict(the_plan["release_inputs"], devices=devices))


def release_plan(manifest: dict | None, settings: dict) -> dict:
    """The plan of a release that is already on the host, from its recorded manifest (``release.json``): a
    rollback target, the live release a failed deploy goes back to, the unit a ``deployer watch`` follows.  What the
    start, watch and smoke stages read, as ``make_plan`` names it; the operator's settings fill only what an older
    manifest did not record (port, model, served name).  The engine is the one the release ran (a rollback may
    cross engines), and so are its drafts per verify step (the smoke's acceptance rate)."""
    from deployer.host.module_utils.host_probe import probe_host_of
    m = dict(manifest or {})
    s = dict(settings)
    root = str(_need(s, "root")).rstrip("/")
    service = str(_need(s, "service_name"))
    try:
        eng = engines.get(m.get("backend") or engines.RECORDED_BEFORE_BACKENDS)
    except engines.EngineError as e:
        raise PlanError(f"release {m.get('id', '?')}: {e}") from e
    argv = [str(a) for a in (m.get("argv") or [])]
    speculative, per_step = eng.speculative_of(argv)      # what the unit starts, whatever else was recorded
    probe = probe_host_of(argv)
    port = m.get("port", s.get("port"))
    dirs = deploy_dirs(root)
    return {
        "backend": eng.name, "engine": eng.describe(str(m.get("engine_version") or m.get("vllm_version") or "")),
        "service": service, "unit_path": f"/etc/systemd/system/{service}.service", "port": port,
        "probe_host": probe, "probe_url": probe_url(probe, port),
        "secrets": live_secrets(dirs, service), "dirs": dirs,
        "served_model_name": m.get("served_model_name", s.get("served_model_name")),
        "model_dir": m.get("model_dir", s.get("model_dir")), "venv": m.get("venv") or "",
        "speculative": speculative, "draft_tokens_per_step": per_step if speculative else 0,
        "drafter": {"dir": m["drafter_dir"]} if m.get("drafter_dir") else None,
    }


