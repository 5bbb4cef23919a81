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
                    ``<root>/venvs/sglang-<version>`` for SGLang (never patched)
patch_state         "present" (apply what this vLLM needs) or "absent" (also every SGLang plan)
credentials         files systemd hands the service (LoadCredential=): {name: file in the live secrets dir};
                    SGLang's API key lives there (it has no environment variable for it, and argv is world-readable)
secrets             the live secrets: {dir, env_file, sglang_file, dropin_path, dropin} (live_secrets); never part
                    of a release (its id, its files): a rollback keeps the live ones
service, unit_path  systemd unit name and path
user                the unprivileged system user the server runs as (never root)
unit                what the unit needs beyond argv/env: user, writable paths, device allow-list (docs/hardening.md),
                    the log-line wrapper's path (None: the engine is the main process)
api_protected       clients must send the API key (or the server listens on loopback only)
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
argv                the full ``vllm serve`` argv, launcher first (built by deployer.serve, nowhere else)
env                 the non-secret environment of the server (secrets go only to the live 0600 secrets files)
restart_delay_seconds  systemd RestartSec
release_inputs      everything that names a release (hashed with the patch fingerprint into its id)
dirs                root, releases, current, previous, drafters, bin, cache (root's: uv), server_cache (the
                    service user's home: torch.compile, Triton, Hugging Face and XDG caches, shared by releases)
==================  ==================================================================================
"""
from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from pathlib import Path
from typing import Any

from deployer import engines, serve, serve_sglang, versions
from deployer.ansible_plugins.module_utils import formats

SECRET_KEYS = ("api_key", "hf_token")
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"   # what a unit without PATH= gets (systemd.exec)
# The unit and env-file templates are part of what names a release: a changed template is a new release (never the
# same id with different files), and a release's recorded unit is the one it was verified with.  The log-line
# wrapper the unit runs is named by its content (line_splitter_path), and that path is a release input too.
_REPO = Path(__file__).resolve().parent.parent
_TEMPLATES = [_REPO / "templates" / n for n in ("engine.service.j2", "engine.env.j2")]
_LINE_SPLITTER = _REPO / "roles" / "render" / "files" / "journal_lines.py"


def line_splitter_sha256() -> str:
    return hashlib.sha256(_LINE_SPLITTER.read_bytes()).hexdigest()


def line_splitter_path(bin_dir: str) -> str:
    """Where the unit's log-line wrapper lives on the host: named by its content (root's bin/, readable by the
    service user), so every release keeps running the exact wrapper it was rendered with."""
    return f"{bin_dir}/journal_lines-{line_splitter_sha256()[:12]}.py"


def templates_hash() -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in _TEMPLATES)).hexdigest()[:12]

_PATCH_ENGINE = Path(__file__).parent / "ansible_plugins" / "module_utils" / "eagle3_patch.py"
_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,30}$")
# A unit name that is a plain file name in /etc/systemd/system and a plain shell word (systemd.unit(5) allows
# more; the deployer needs no more).  A release like 0.16.0, 0.11.2.post1 or 0.20.0rc1: a path component too.
_SERVICE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_DEVICE_RE = re.compile(r"^(char-[A-Za-z0-9_.-]+|/dev/[A-Za-z0-9_./-]+)( [rwm]{1,3})?$")


class PlanError(ValueError):
    """Bad deploy input; the message names the setting, the value and what is expected."""


def content_hash(value: Any, length: int = 12) -> str:
    """Stable short hash of any JSON-able value (release ids, env hashes)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:length]


def patch_engine_id() -> str:
    """The patch engine's identity: a hash of its code's tokens, its comments and blank lines left out.  Part of the
    patched venv's name, so a changed patch engine never reuses a venv another one patched - and a comment edit does
    not reinstall every patched host's ~10 GB venv (issue 43)."""
    import io
    import tokenize
    toks = tokenize.generate_tokens(io.StringIO(_PATCH_ENGINE.read_text()).readline)
    code = "\0".join(f"{t.type}:{t.string}" for t in toks if t.type not in (tokenize.COMMENT, tokenize.NL))
    return hashlib.sha256(code.encode()).hexdigest()[:8]


def is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def probe_host(bind: str) -> str:
    """Where the host's own checks (health, watch, smoke) reach the server: the address it binds, or loopback of
    the same family when it binds them all (module_utils/releases.probe_address: the host side's rule too)."""
    from deployer.ansible_plugins.module_utils.releases import probe_address
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


def _need(s: dict, key: str) -> Any:
    if key not in s:
        raise PlanError(f"plan: setting {key!r} missing")
    return s[key]


def make_plan(settings: dict, drafter_manifest: dict | None = None) -> dict:
    """``settings``: the ``deployer_*`` variables without the prefix (see roles/deployer/defaults)."""
    s = dict(settings)
    backend = s.get("backend", "vllm")
    try:
        eng = engines.get(backend)
    except engines.EngineError as e:
        raise PlanError(str(e)) from e
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
    service = str(_need(s, "service_name"))
    if not _SERVICE_RE.fullmatch(service):
        raise PlanError(f"service_name: got {service!r}, expected a unit name without .service: a letter or digit "
                        "then up to 63 of [A-Za-z0-9_-] (it becomes a file name and a shell word)")
    speculative = bool(s.get("speculative_enabled", True))
    dirs = deploy_dirs(root)
    user = str(s.get("service_user") or "vllm")
    if not _USER_RE.fullmatch(user) or user == "root":
        raise PlanError(f"service_user: got {user!r}, expected a system user name other than root "
                        "([a-z_][a-z0-9_-]*, at most 31 characters)")
    bind = str(s.get("host", "0.0.0.0"))
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
            serve.systemd_exec_quote(word)
    except serve.ServeConfigError as e:
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
            raise PlanError(f"environment: {k}={str(v)!r} contains the control character {bad}; an env file line "
                            "ends there")
        env[k] = str(v)
    restart_delay = int(s.get("restart_delay_seconds", 30))
    line_splitter = s.get("log_line_splitter", True)
    if not isinstance(line_splitter, bool):
        raise PlanError(f"log_line_splitter: got {line_splitter!r}, expected true or false")
    wrapper = line_splitter_path(dirs["bin"]) if line_splitter else None

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
                 "line_splitter": wrapper},
        "api_protected": api_protected,
        "port": s.get("port"), "served_model_name": s.get("served_model_name"), "model_dir": s.get("model_dir"),
        "speculative": speculative, "drafter": drafter, "argv": argv, "env": env,
        "draft_tokens_per_step": eng.draft_tokens_per_step(s) if speculative else 0,
        "restart_delay_seconds": restart_delay, "dirs": dirs,
        "secrets": live_secrets(dirs, service),
        "release_inputs": {"argv": argv, "engine": backend, "version": version,
                           "drafter": drafter["tree_sha256"] if drafter else None,
                           "env": env, "restart_delay": restart_delay,
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


def common_spec(s: dict, venv: str, program: str) -> dict:
    """The argv fields every engine takes from the same settings (serve.common_fields validates them)."""
    launcher = s.get("launcher") or [f"{venv}/bin/{program}"]
    return {"launcher": [a.replace("{python}", f"{venv}/bin/python") for a in launcher],
            "model": s.get("model_dir"), "served_model_name": s.get("served_model_name"),
            "host": s.get("host", "0.0.0.0"), "port": s.get("port"),
            "tensor_parallel_size": s.get("tensor_parallel_size")}


SECRETS_ENV_FILE = "server.env"


def live_secrets(dirs: dict, service: str) -> dict:
    """Where the live secrets are (docs/security.md, "Secrets"): one root-only directory, never a release.  The
    unit drop-in hands them to whatever release runs, so a rollback restores code and flags, never old secrets
    (a later EnvironmentFile= overrides an earlier one: a release rendered before secrets moved out of releases
    runs with the live ones too)."""
    d = dirs["secrets"]
    env_file = f"{d}/{SECRETS_ENV_FILE}"
    return {"dir": d, "env_file": env_file, "sglang_file": f"{d}/{serve_sglang.SECRETS_FILE}",
            "dropin_path": f"/etc/systemd/system/{service}.service.d/deployer-secrets.conf",
            "dropin": ("# Managed by deployer: the live secrets, for whatever release runs (docs/security.md).\n"
                       f"[Service]\nEnvironmentFile={env_file}\n")}


def release_plan(manifest: dict | None, settings: dict) -> dict:
    """The plan of a release that is already on the host, from its recorded manifest (``release.json``): a
    rollback target, the live release a failed deploy goes back to, the unit a ``deployer watch`` follows.  What the
    start, watch and smoke stages read, as ``make_plan`` names it; the operator's settings fill only what an older
    manifest did not record (port, model, served name).  The engine is the one the release ran (a rollback may
    cross engines), and so are its drafts per verify step (the smoke's acceptance rate)."""
    from deployer.ansible_plugins.module_utils.releases import probe_host_of
    m = dict(manifest or {})
    s = dict(settings)
    root = str(_need(s, "root")).rstrip("/")
    service = str(_need(s, "service_name"))
    try:
        eng = engines.get(m.get("backend") or "vllm")
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


def secret_files(api_key: str, hf_token: str) -> dict:
    """The contents of the live secret files (written 0600 by the start stage; never printed): the server's
    environment (vLLM's key, the Hugging Face token) and SGLang's --config YAML with its key.  Both engines'
    files are written whatever runs now, so that a rollback across engines finds its key."""
    from deployer.ansible_plugins.module_utils import envfile
    lines = ["# Managed by deployer.  Mode 0600: the live secrets (docs/security.md)."]
    if api_key:
        lines.append("VLLM_API_KEY=" + envfile.quote(api_key))
    if hf_token:
        lines.append("HF_TOKEN=" + envfile.quote(hf_token))
    yaml_text = "# Managed by deployer.  Mode 0600: SGLang's API key (merged with --config).\n" + \
        (f"api-key: {json.dumps(api_key)}\n" if api_key else "{}\n")
    return {SECRETS_ENV_FILE: "\n".join(lines) + "\n", serve_sglang.SECRETS_FILE: yaml_text}


def release_id(plan: dict, patch_fingerprint: str | None) -> str:
    """A release is named by the hash of everything that defines it: an unchanged deploy renders the
    same release, changes nothing and restarts nothing."""
    return content_hash(dict(plan["release_inputs"], patch=patch_fingerprint))


# ------------------------------------------------------------------ the no-op check (one round trip)
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


def noop_check(expected: dict, state: dict, the_plan: dict, unit_sha256: str, env_sha256: str) -> dict:
    """Pure: is the planned release already live and serving, exactly?  ``unit_sha256``/``env_sha256``: the
    unit and env file the render stage would write, rendered on the controller.  Every check is on the
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
    if (unit.get("ActiveState"), unit.get("SubState"), unit.get("NeedDaemonReload")) != ("active", "running", "no"):
        reasons.append("the server is {}/{}{}".format(unit.get("ActiveState"), unit.get("SubState"),
                                                     " (unit changed on disk)" if unit.get("NeedDaemonReload") == "yes"
                                                     else ""))
    if probe.get("health") != 200:
        reasons.append(f"/health answered {probe.get('health')}")
    return {"noop": not reasons, "release": expected["id"], "fingerprint": expected["fingerprint"],
            "patches": expected["patches"], "reasons": reasons}
