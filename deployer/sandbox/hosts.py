"""Sandbox hosts: real sshd + real systemd on this machine, with a simulated GPU box inside.

Each host is a ``systemd-nspawn --boot`` container (systemd is PID 1, so unit files,
``systemctl`` and ``journalctl`` are the real ones) in its own network namespace on
the bridge ``dpsbx0`` (10.77.0.1/24, host N at 10.77.0.(10+N), no route anywhere
else), with a private overlay root: lower layer = this machine's ``/``, upper layer
on disk under the state dir (a vLLM venv is ~10 GB: RAM-backed layers would not do).

What is simulated lives in ``deployer/sandbox/`` and is provisioned here:
``/usr/local/bin/nvidia-smi`` (8x RTX PRO 6000 Blackwell), a Kimi-K2.5-shaped model
directory, the vLLM stand-in server, and the rehearsal knobs in /etc/deployer-sandbox/.

Packages: the hosts have no route to a package index, like many production GPU
hosts.  The deployer installs vLLM with ``uv --offline`` from the host's uv cache
(``install_offline``); the sandbox pre-seeds that cache by hard-linking the
controller's uv cache into the host's upper layer (0.9 s for 10 GB, no extra disk).
The controller's cache is filled by ``scripts/dev.sh`` (a real install of each vLLM
release the tests use, from the index).  On a real offline host the same role variable works after the
cache is seeded (rsync), or use ``install_wheelhouse_dir``.

Pitfalls handled (docs/sandbox.md): clean /root (no pyenv in
.bashrc), opaque *.target.wants, fresh machine-id, never SIGTERM the container's
systemd (SIGTERM nspawn instead), close ssh ControlPersist masters before tearing
the bridge down.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from deployer import tools

# Independent sandboxes side by side (parallel test modules): DEPLOYER_SANDBOX_SLOT=N gives its own bridge,
# subnet, namespaces, state directory and SSH control sockets.  Slot 0 is the default.
SLOT = int(os.environ.get("DEPLOYER_SANDBOX_SLOT", "0") or 0)
BRIDGE = f"dpsbx{SLOT}"
NET = f"10.{77 + SLOT}.0"
STATE = Path(os.environ.get("DEPLOYER_SANDBOX_DIR") or
             ("/var/lib/deployer-sandbox" + (f"-{SLOT}" if SLOT else "")))
HERE = Path(__file__).resolve().parent
# The controller's checkout, visible read-only at the same path inside sandbox hosts (wherever it lives,
# /tmp included) so a test can run the controller side on a host that boots systemd (schedule timers).
# Deploys never use it: Ansible ships what a host needs.
REPO = HERE.parent.parent
MODEL_DIR = "/srv/models/Kimi-K2.5"
KNOBS_DIR = "/etc/deployer-sandbox"
STANDIN_SEED = "/var/lib/deployer-sandbox/standin-seed"   # the seed's stand-in answers (root's, read-only to it)
# the stand-in's answer files (standin.py names them so): the only names saved, and restored into a tmpfiles.d line
STANDIN_ANSWER = re.compile(r"eagle3-[0-9a-f]{16}\.json")
STANDIN_PATH = "/usr/local/lib/deployer-sandbox/vllm_standin.py"
DEPLOY_ROOT = "/opt/deployer"
APT_PACKAGES = ("openssh-server", "openssh-client", "rsync", "systemd-container", "iproute2", "sudo")
# A "sudo host" (`deployer sandbox start --sudo`) refuses root over SSH, as many production hosts do: the deployer
# logs in as this user and becomes root with sudo (Ansible become).
SUDO_USER, SUDO_UID = "deploy", 4242

SSHD_CONFIG = """\
Port 22
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
UseDNS no
Subsystem sftp internal-sftp
MaxStartups 100:30:200
MaxSessions 64
AcceptEnv LANG LC_*
"""


class SandboxError(RuntimeError):
    pass


@dataclass
class Host:
    name: str
    ip: str

    @property
    def dir(self) -> Path:
        return STATE / self.name


def _run(prog, *args, check=True, **kw):
    """Run a system program found by ``tools.system`` (never the caller's PATH)."""
    exe = prog if os.path.isabs(str(prog)) else tools.system(prog)
    return subprocess.run([exe, *(str(a) for a in args)], check=check, text=True, capture_output=True, **kw)


def host(i: int) -> Host:
    return Host(f"sbx{i}", f"{NET}.{10 + i}")


def uv_cache_dir() -> Path:
    """The controller's uv cache (what ``scripts/dev.sh`` filled), from the uv the deployer ships with."""
    out = _run(tools.uv(), "cache", "dir", check=False)
    return Path(out.stdout.strip() or Path.home() / ".cache" / "uv")


def controller_key() -> Path:
    key = STATE / "id_ed25519"
    if not key.exists():
        STATE.mkdir(parents=True, exist_ok=True)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "deployer-sandbox", "-f", key)
    return key


def api_key() -> str:
    """The sandbox servers' API key (made once, 0600): a sandbox host serves its bridge address, and the
    deployer refuses a non-loopback server without a key (deployer_allow_unauthenticated)."""
    path = STATE / "api_key"
    if not path.exists():
        import secrets
        STATE.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("sbx-" + secrets.token_urlsafe(24))
    return path.read_text().strip()


# ------------------------------------------------------------------ the simulated GPU box
def kimi_config(num_layers: int = 61) -> dict:
    """A Kimi-K2.5-shaped config.json (vLLM's KimiK25Config reads text_config as DeepseekV3Config)."""
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config",
                     "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration"},
        "bos_token_id": 163584, "eos_token_id": 163585, "pad_token_id": 163839,
        "media_placeholder_token_id": 163605,
        "text_config": {
            "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
            "num_hidden_layers": num_layers, "hidden_size": 7168, "intermediate_size": 18432,
            "moe_intermediate_size": 2048, "n_routed_experts": 384, "num_experts_per_tok": 8,
            "n_shared_experts": 1, "first_k_dense_replace": 1, "num_attention_heads": 64,
            "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "vocab_size": 163840, "max_position_embeddings": 262144, "rms_norm_eps": 1e-5,
            "rope_theta": 50000.0, "torch_dtype": "bfloat16",
            "bos_token_id": 163584, "eos_token_id": 163585,
        },
        "vision_config": {"patch_size": 14, "init_pos_emb_height": 64, "init_pos_emb_width": 64,
                          "num_attention_heads": 16, "num_hidden_layers": 27, "hidden_size": 1152,
                          "intermediate_size": 4304, "merge_kernel_size": [2, 2]},
        "torch_dtype": "bfloat16",
    }


def drafter_config() -> dict:
    """Shape of AQ-MedAI/Kimi-K25-eagle3 (LlamaForCausalLMEagle3)."""
    return {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 1,
        "num_attention_heads": 64, "num_key_value_heads": 64, "head_dim": 128,
        "vocab_size": 163840, "draft_vocab_size": 32000, "max_position_embeddings": 262144,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58], "use_aux_hidden_state": True},
    }


def safetensors_bytes(tensors: dict) -> bytes:
    """A safetensors file (8-byte little-endian header length, JSON header, the tensors' bytes): name -> (dtype,
    shape, data).  The format: https://github.com/huggingface/safetensors#format"""
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)     # the header is padded with spaces to 8 bytes, as the library writes it
    return len(h).to_bytes(8, "little") + h + data


def write_model_dir(root: Path, shards: int = 64) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(kimi_config(), indent=2))
    # SANDBOX: the real checkpoint ships Moonshot's configuration_kimi_k25.py (config.json's auto_map names it;
    # SGLang loads it with --trust-remote-code).  This one re-exports the serving engine's own copy of the class.
    (root / "configuration_kimi_k25.py").write_text(
        "# SANDBOX stand-in for the checkpoint's own file: the installed engine's KimiK25Config.\n"
        "try:\n    from sglang.srt.configs.kimi_k25 import KimiK25Config  # noqa: F401\n"
        "except ImportError:\n    from vllm.transformers_utils.configs.kimi_k25 import KimiK25Config  # noqa: F401\n")
    names = [f"model-{i:05d}-of-{shards:06d}.safetensors" for i in range(1, shards + 1)]
    weight_map = {f"language_model.model.layers.{i}.mlp.experts.weight": n for i, n in enumerate(names)}
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": shards * 16}, "weight_map": weight_map}, indent=2))
    for w, n in weight_map.items():   # stand-ins for ~9.8 GB shards: real safetensors files, one 16-byte tensor each
        (root / n).write_bytes(safetensors_bytes({w: ("BF16", [8], b"\0" * 16)}))
    (root / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 262144}))


def drafter_tensors(cfg: dict | None = None, fc_in: int | None = None) -> dict:
    """The tensors of AQ-MedAI/Kimi-K25-eagle3 (LlamaForCausalLMEagle3): names and shapes as the checkpoint has
    them, so that the drafter check reads what it would read on a real host."""
    c = cfg or drafter_config()
    h, heads, kv, hd, inter = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], \
        c["intermediate_size"]
    return {"fc.weight": ("BF16", [h, fc_in or 3 * h]), "d2t": ("I64", [c["draft_vocab_size"]]),
            "t2d": ("BOOL", [c["vocab_size"]]), "lm_head.weight": ("BF16", [c["draft_vocab_size"], h]),
            "norm.weight": ("BF16", [h]), "midlayer.input_layernorm.weight": ("BF16", [h]),
            "midlayer.hidden_norm.weight": ("BF16", [h]),
            "midlayer.self_attn.q_proj.weight": ("BF16", [heads * hd, 2 * h]),
            "midlayer.self_attn.k_proj.weight": ("BF16", [kv * hd, 2 * h]),
            "midlayer.self_attn.v_proj.weight": ("BF16", [kv * hd, 2 * h]),
            "midlayer.self_attn.o_proj.weight": ("BF16", [h, heads * hd]),
            "midlayer.post_attention_layernorm.weight": ("BF16", [h]),
            "midlayer.mlp.gate_proj.weight": ("BF16", [inter, h]), "midlayer.mlp.up_proj.weight": ("BF16", [inter, h]),
            "midlayer.mlp.down_proj.weight": ("BF16", [h, inter])}


def drafter_weights_bytes(tensors: dict, data_bytes: int = 1 << 20) -> bytes:
    """SANDBOX: a safetensors file whose header is the real checkpoint's (names, dtypes, shapes, offsets), followed
    by ``data_bytes`` of random data instead of ~6 GB: the drafter check reads only the header; nothing loads it."""
    size = {"BF16": 2, "I64": 8, "BOOL": 1}
    header, off = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = size[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return len(h).to_bytes(8, "little") + h + os.urandom(data_bytes)


def write_drafter_dir(root: Path, fc_in: int | None = None) -> Path:
    """The drafter checkpoint on the *controller* (the operator's machine), shipped by the drafter role: its real
    config and a header-true safetensors file (``fc_in``: another fc input size, for a drafter that does not fit)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(drafter_config(), indent=2))
    weights = root / "model.safetensors"
    want = drafter_tensors(fc_in=fc_in)
    try:
        from deployer.drafter_fit import safetensors_shapes
        current = safetensors_shapes(weights)
    except (OSError, ValueError):
        current = None
    if current != {k: v[1] for k, v in want.items()}:   # kept when it is already this one (its hash is cached)
        weights.write_bytes(drafter_weights_bytes(want))
    return root


# ------------------------------------------------------------------ lifecycle
def _prepare_upper(h: Host, pubkey: str, seed: Path | None = None, package_cache: bool = True) -> Path:
    d = h.dir
    upper, work, merged = d / "upper", d / "work", d / "merged"
    for p in (upper, work, merged):
        p.mkdir(parents=True, exist_ok=True)
    opaque = []

    def mk(rel, mode=0o755):
        p = upper / rel
        p.mkdir(parents=True, exist_ok=True)
        os.chmod(p, mode)
        return p

    root = mk("root", 0o700)
    opaque += [root, mk("tmp", 0o1777), mk("var/lib/deployer-sandbox"), mk("opt/deployer")]
    for f in (".bashrc", ".profile"):
        shutil.copy(f"/etc/skel/{f}", root / f)
    ssh = mk("root/.ssh", 0o700)
    (ssh / "authorized_keys").write_text(pubkey)
    os.chmod(ssh / "authorized_keys", 0o600)
    etc_ssh = mk("etc/ssh")
    for f in ("ssh_host_ed25519_key", "ssh_host_ed25519_key.pub"):
        shutil.copy(d / f, etc_ssh / f)
    os.chmod(etc_ssh / "ssh_host_ed25519_key", 0o600)
    (etc_ssh / "sshd_config").write_text(SSHD_CONFIG if not is_sudo(h) else
                                         SSHD_CONFIG.replace("PermitRootLogin prohibit-password", "PermitRootLogin no"))
    if is_sudo(h):
        _add_sudo_user(upper, mk, pubkey)
    (upper / "etc/hostname").write_text(h.name + "\n")
    (upper / "etc/hosts").write_text(f"127.0.0.1 localhost\n{h.ip} {h.name}\n")
    (upper / "etc/machine-id").write_text(os.urandom(16).hex() + "\n")
    sysd = mk("etc/systemd/system")
    for w in ("multi-user.target.wants", "timers.target.wants", "getty.target.wants", "sysinit.target.wants"):
        opaque.append(mk(f"etc/systemd/system/{w}"))
    (sysd / "multi-user.target.wants/ssh.service").symlink_to("/lib/systemd/system/ssh.service")
    for u in ("console-getty.service", "getty@.service", "serial-getty@.service", "postgresql.service",
              "postgresql@.service", "systemd-timesyncd.service", "e2scrub_reap.service",
              "apt-daily.service", "apt-daily-upgrade.service", "man-db.service"):
        p = sysd / u
        if not p.exists() and not p.is_symlink():
            p.symlink_to("/dev/null")
    # the simulated GPU box
    bin_ = mk("usr/local/bin")
    shutil.copy(HERE / "nvidia_smi.py", bin_ / "nvidia-smi")
    os.chmod(bin_ / "nvidia-smi", 0o755)
    lib = mk("usr/local/lib/deployer-sandbox")
    shutil.copy(HERE / "standin.py", lib / "vllm_standin.py")
    shutil.copy(HERE / "sglang_standin.py", lib / "sglang_standin.py")   # plays SGLang (backend sglang)
    # the stand-in's own bookkeeping (argv.json, ready/died marks): it runs as the unprivileged service
    # user under ProtectSystem=strict, so the directory is made at boot and allowed in the inventory
    tmpfiles = mk("etc/tmpfiles.d")
    conf = "d /run/deployer-standin 1777 root root -\n"
    # a pre-baked image (save_seed) also keeps the stand-in's answers of the real supports_eagle3() (keyed by the
    # venv's files: sizes and mtimes, which hard links keep), copied in at each boot: SANDBOX bookkeeping
    if seed and (seed / ".standin").is_dir():
        keep = mk(STANDIN_SEED.lstrip("/"))
        for f in sorted((seed / ".standin").iterdir()):
            if not STANDIN_ANSWER.fullmatch(f.name):      # a name with a space or line end would break the line
                continue
            shutil.copy2(f, keep / f.name)
            conf += f"C /run/deployer-standin/{f.name} - - - - {STANDIN_SEED}/{f.name}\n"
    (tmpfiles / "deployer-standin.conf").write_text(conf)
    knobs = mk(KNOBS_DIR.lstrip("/"))
    (knobs / "gpus.json").write_text("{}\n")
    (knobs / "standin.json").write_text("{}\n")
    (knobs / "README").write_text("SANDBOX host: nvidia-smi and the vLLM stand-in read these rehearsal knobs.\n")
    write_model_dir(upper / MODEL_DIR.lstrip("/"))
    # the host's package cache, hard-linked from the controller's uv cache (see module docstring); ~250,000 entries
    # to link in and unlink again (~10 CPU-s a boot), so only for a host that may install (``package_cache``)
    cache = uv_cache_dir()
    if package_cache and cache.is_dir():
        dst = upper / DEPLOY_ROOT.lstrip("/") / "cache"
        dst.mkdir(parents=True, exist_ok=True)
        _run("cp", "-al", cache, dst / "uv")
    # a pre-baked image (save_seed): finished venvs another sandbox host's deploy made, hard-linked in like the uv
    # cache (their files are the cache's own links); the deployer finds them complete and installs nothing
    if seed and seed.is_dir():
        venvs = mk(DEPLOY_ROOT.lstrip("/") + "/venvs")
        for v in sorted(seed.iterdir()):
            if not v.name.startswith(".") and (v / ".deployer-installed").is_file():
                _run("cp", "-al", v, venvs / v.name)
        if (seed / ".verify").is_dir():
            verdicts = mk(DEPLOY_ROOT.lstrip("/") + "/cache/verify")
            for f in (seed / ".verify").glob("*.json"):
                shutil.copy2(f, verdicts / f.name)
    for p in opaque:
        os.setxattr(p, "trusted.overlay.opaque", b"y")
    return merged


def _add_sudo_user(upper: Path, mk, pubkey: str) -> None:
    """SANDBOX: the login user of a sudo host: passwordless sudo, the controller's key, no root login."""
    etc = upper / "etc"
    for name, line in (("passwd", f"{SUDO_USER}:x:{SUDO_UID}:{SUDO_UID}:deployer sandbox sudo user:"
                                  f"/home/{SUDO_USER}:/bin/bash"),
                       ("group", f"{SUDO_USER}:x:{SUDO_UID}:"), ("shadow", f"{SUDO_USER}:*:19000:0:99999:7:::")):
        text = Path(f"/etc/{name}").read_text()
        (etc / name).write_text(text + ("" if text.endswith("\n") else "\n") + line + "\n")
    os.chmod(etc / "shadow", 0o640)
    home = mk(f"home/{SUDO_USER}", 0o750)
    ssh_dir = mk(f"home/{SUDO_USER}/.ssh", 0o700)
    (ssh_dir / "authorized_keys").write_text(pubkey)
    os.chmod(ssh_dir / "authorized_keys", 0o600)
    for p in (home, ssh_dir, ssh_dir / "authorized_keys"):
        os.chown(p, SUDO_UID, SUDO_UID)
    sudoers = mk("etc/sudoers.d", 0o750)
    (sudoers / SUDO_USER).write_text(f"{SUDO_USER} ALL=(ALL:ALL) NOPASSWD: ALL\n")
    os.chmod(sudoers / SUDO_USER, 0o440)


def _machine(h: Host) -> str:
    """nspawn's machine name (unique per slot; the host's own hostname stays h.name, from /etc/hostname)."""
    return h.name if not SLOT else f"s{SLOT}-{h.name}"


def _netns(h: Host) -> str:
    return f"dps{SLOT or ''}-{h.name}"


def _ensure_bridge():
    if _run("ip", "link", "show", BRIDGE, check=False).returncode != 0:
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{NET}.1/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")


def is_running(h: Host) -> bool:
    pidf = h.dir / "launcher.pid"
    if not pidf.exists():
        return False
    try:
        stat = Path(f"/proc/{int(pidf.read_text())}/stat").read_text().split(") ")[1][0]
        return stat not in "ZX"
    except (OSError, ValueError, IndexError):
        return False


def start_host(i: int, seed: Path | None = None, package_cache: bool = True) -> Host:
    h = host(i)
    if is_running(h):
        return h
    _stop_host(h)  # leftovers of a crashed run
    key = controller_key()
    h.dir.mkdir(parents=True, exist_ok=True)
    if not (h.dir / "ssh_host_ed25519_key").exists():
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", h.name, "-f", h.dir / "ssh_host_ed25519_key")
    _prepare_upper(h, Path(f"{key}.pub").read_text(), seed, package_cache)
    _ensure_bridge()
    ns = _netns(h)
    _run("ip", "link", "del", ns, check=False)
    _run("ip", "netns", "del", ns, check=False)
    _run("ip", "netns", "add", ns)
    _run("ip", "link", "add", ns, "type", "veth", "peer", "name", "eth0", "netns", ns)
    _run("ip", "link", "set", ns, "master", BRIDGE, "up")
    _run("ip", "-n", ns, "addr", "add", f"{h.ip}/24", "dev", "eth0")
    _run("ip", "-n", ns, "link", "set", "eth0", "up")
    _run("ip", "-n", ns, "link", "set", "lo", "up")
    _boot(h)
    return h


def _boot(h: Host) -> None:
    """Boot the host's container on its disk (the overlay's upper layer) in its network namespace."""
    d, ns = h.dir, _netns(h)
    script = (
        f"set -e; {tools.system('mount')} -t overlay overlay "
        f"-o lowerdir=/,upperdir={d}/upper,workdir={d}/work {d}/merged; "
        f"exec {tools.system('systemd-nspawn')} --quiet --register=no --keep-unit --link-journal=no --console=passive "
        f"-M {_machine(h)} -D {d}/merged --network-namespace-path=/run/netns/{ns} "
        f"--bind-ro={shlex.quote(str(REPO))} --boot"
    )
    log = open(d / "console.log", "a")
    p = subprocess.Popen([tools.system("unshare"), "--mount", "--propagation", "private", "--",
                          tools.system("bash"), "-c", script],
                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    (d / "launcher.pid").write_text(str(p.pid))


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def reboot(name: str, hard: bool = False, timeout: float = 120.0) -> float:
    """SANDBOX: reboot a host on its own disk, as an operator's reboot does (orderly: systemd stops every unit,
    then the machine starts again) or as a power cut does (``hard``: the container is killed, nothing is stopped).
    Everything on its disk stays (releases, venvs, the enabled unit); what lives in memory is gone.  Returns the
    seconds until it answers SSH again."""
    h = next((x for x in hosts_on_disk() if x.name == name), None)
    if h is None or not is_running(h):
        raise SandboxError(f"{name} is not a running sandbox host")
    t0 = time.time()
    launcher = int((h.dir / "launcher.pid").read_text())
    if hard:
        # kill the machine's init (nspawn's child): the kernel then kills every process of the container at once.
        # Killing nspawn itself would leave the container running, orphaned.
        for child in _children(launcher):
            os.kill(child, signal.SIGKILL)
    else:
        os.kill(launcher, signal.SIGTERM)     # nspawn asks the machine's systemd to shut down in order
    for _ in range(600):
        if not is_running(h):
            break
        time.sleep(0.1)
    else:
        raise SandboxError(f"{name} did not stop within 60 s")
    # the overlay was mounted in the launcher's private mount namespace: gone with it; its ssh masters too
    for c in list(STATE.glob(f"cp-*@{h.name}:*")) + list(STATE.glob(f"cp-*@{h.ip}:*")):
        c.unlink(missing_ok=True)
    shutil.rmtree(STATE / "cp-ansible", ignore_errors=True)
    (STATE / "cp-ansible").mkdir(exist_ok=True)
    _boot(h)
    wait_ssh(h, timeout)
    return time.time() - t0


def wait_ssh(h: Host, timeout: float = 60.0) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        r = _run("ssh", "-F", STATE / "ssh_config", "-o", "BatchMode=yes", "-o", "ConnectTimeout=2",
                 h.name, "systemctl is-system-running --wait >/dev/null 2>&1; true", check=False, timeout=30)
        if r.returncode == 0:
            return
        time.sleep(0.3)
    raise SandboxError(f"{h.name} ({h.ip}) did not answer ssh within {timeout:.0f} s; "
                       f"console: {(h.dir / 'console.log').read_text()[-2000:]}")


def write_client_files(hosts: list[Host]) -> None:
    """known_hosts (pinned host keys), ssh_config, inventory and ansible.cfg for the sandbox."""
    key = controller_key()
    kh, sc = [], []
    for h in hosts:
        pub = (h.dir / "ssh_host_ed25519_key.pub").read_text().split()
        kh.append(f"{h.name},{h.ip} {pub[0]} {pub[1]}")
        sc.append(f"Host {h.name}\n  HostName {h.ip}\n  User {SUDO_USER if is_sudo(h) else 'root'}\n"
                  f"  IdentityFile {key}\n  IdentitiesOnly yes\n"
                  f"  UserKnownHostsFile {STATE}/known_hosts\n  HostKeyAlias {h.name}\n  StrictHostKeyChecking yes\n"
                  f"  ControlMaster auto\n  ControlPath {STATE}/cp-%r@%h:%p\n  ControlPersist 60s\n")
    (STATE / "known_hosts").write_text("\n".join(kh) + "\n")
    (STATE / "ssh_config").write_text("\n".join(sc))
    import yaml
    hostvars = {h.name: dict({"ansible_host": h.ip}, **({"ansible_user": SUDO_USER, "ansible_become": True}
                                                        if is_sudo(h) else {}))
                for h in hosts if not is_balancer(h)}
    lbs = {h.name: {"ansible_host": h.ip} for h in hosts if is_balancer(h)}
    inv = {"all": {"vars": {
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(key),
        "ansible_python_interpreter": "/usr/bin/python3",
        # this sandbox's own SSH control sockets: stopping one sandbox never cuts another's connections
        "ansible_control_path_dir": str(STATE / "cp-ansible"),
        # known_hosts names each host by name and address: no HostKeyAlias, so that a task delegated to the
        # balancer checks the balancer's key, not the delegating host's
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={STATE}/known_hosts -o StrictHostKeyChecking=yes",
    }, "children": {"gpu": {"hosts": hostvars, "vars": {
        # SANDBOX: the engine is the vLLM stand-in, run by the release venv's python so that it can
        # ask the real, installed vLLM for supports_eagle3(); packages come from the pre-seeded uv cache.
        "deployer_sandbox": True,
        "deployer_launcher": ["{python}", STANDIN_PATH],
        "install_offline": True,
        "deployer_drafter_src_dir": str(STATE / "drafter"),
        "deployer_model_dir": MODEL_DIR,
        "deployer_api_key": "{{ lookup('ansible.builtin.file', '%s') }}" % (STATE / "api_key"),
        "deployer_writable_paths": ["-/run/deployer-standin"],
    }}}}}
    if lbs:   # SANDBOX: HAProxy from the controller's own package (the hosts share its file system)
        inv["all"]["children"]["balancer"] = {"hosts": lbs, "vars": {"deployer_sandbox": True}}
    (STATE / "inventory.yml").write_text(
        "# Written by `deployer sandbox start`.  Sandbox hosts only.\n" + yaml.safe_dump(inv, sort_keys=False))
    write_drafter_dir(STATE / "drafter")
    api_key()


def hosts_on_disk() -> list[Host]:
    if not STATE.exists():
        return []
    out = []
    for d in sorted(STATE.glob("sbx*")):
        if d.name[3:].isdigit():
            out.append(host(int(d.name[3:])))
    return out


def _role(h: Host) -> str:
    return (h.dir / "role").read_text().strip() if (h.dir / "role").exists() else ""


def is_balancer(h: Host) -> bool:
    return _role(h) == "balancer"


def is_sudo(h: Host | str) -> bool:
    """A host that refuses root over SSH (``start(sudo=True)``)."""
    return _role(host(int(h[3:])) if isinstance(h, str) else h) == "sudo"


def start(n: int = 1, balancer: bool = False, sudo: bool = False, seed: Path | None = None,
          cold: tuple[int, ...] = (), package_cache: bool = True) -> list[Host]:
    """Hosts sbx1..sbxN (group gpu); with ``balancer`` one more, sbx<N+1>, running HAProxy (group balancer); with
    ``sudo`` the gpu hosts refuse root over SSH and the deployer logs in as ``deploy`` and uses sudo; with ``seed``
    (a directory save_seed filled) the gpu hosts boot with its finished venvs in place, but those numbered in
    ``cold``; ``package_cache=False``: the gpu hosts get no package cache (they can install nothing; the balancer
    never has one)."""
    missing = [c for c in ("systemd-nspawn", "sshd", "ip", "unshare", "ssh", "ssh-keygen") if not tools.find(c)]
    if balancer and not tools.find("haproxy"):
        missing.append("haproxy")
    if missing:
        raise SandboxError(f"missing on this machine: {', '.join(missing)}; install: apt-get install -y "
                           + " ".join(APT_PACKAGES))
    for i in range(1, n + 1):
        (host(i).dir / "role").unlink(missing_ok=True)
        if sudo:
            host(i).dir.mkdir(parents=True, exist_ok=True)
            (host(i).dir / "role").write_text("sudo\n")
    if balancer:
        lb = host(n + 1)
        lb.dir.mkdir(parents=True, exist_ok=True)
        (lb.dir / "role").write_text("balancer\n")
    hosts = [start_host(i, seed if i <= n and i not in cold else None, package_cache and i <= n)
             for i in range(1, n + 1 + (1 if balancer else 0))]
    write_client_files(sorted({h.name: h for h in hosts + hosts_on_disk() if is_running(h)}.values(),
                              key=lambda h: h.name))
    for h in hosts:
        wait_ssh(h)
    return hosts


def save_seed(h: Host, venv: str, seed: Path) -> bool:
    """Keep the finished venv ``venv`` of host ``h`` (its upper layer, on this machine's disk) in ``seed`` for
    later hosts (start(seed=...)): hard links, so instant and no extra disk.  Only a venv the deployer marked
    complete; the first one saved wins.  True when this call saved it."""
    src = h.dir / "upper" / venv.lstrip("/")
    dst = seed / Path(venv).name
    if dst.exists() or not (src / ".deployer-installed").is_file():
        return False
    seed.mkdir(parents=True, exist_ok=True)
    # the engine's verdicts that host cached (keyed by everything they depend on: argv, patches, model config,
    # platform, verifier), so that later hosts do not re-verify the same launch
    verdicts = h.dir / "upper" / DEPLOY_ROOT.lstrip("/") / "cache" / "verify"
    if verdicts.is_dir():
        (seed / ".verify").mkdir(exist_ok=True)
        for f in verdicts.glob("*.json"):
            shutil.copy2(f, seed / ".verify" / f.name)
    _save_standin_answers(h, seed)
    tmp = seed / f".{dst.name}.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    _run("cp", "-al", src, tmp)
    try:
        os.rename(tmp, dst)
    except OSError:          # another process saved it first
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    return True


def _save_standin_answers(h: Host, seed: Path) -> None:
    """The stand-in's remembered supports_eagle3() answers on ``h`` (its tmpfs /run, so read over SSH) into
    ``seed``: later hosts' first load does not import vLLM's model classes again (~20 CPU-s each)."""
    r = ssh(h.name, "cd /run/deployer-standin 2>/dev/null && grep -H . eagle3-*.json || true", check=False)
    for line in r.stdout.splitlines():
        name, _, body = line.partition(":")
        if STANDIN_ANSWER.fullmatch(name) and body.startswith("{"):
            (seed / ".standin").mkdir(exist_ok=True)
            (seed / ".standin" / name).write_text(body + "\n")


def _stop_host(h: Host) -> None:
    pidf = h.dir / "launcher.pid"
    if pidf.exists():
        try:
            pid = int(pidf.read_text())
            # the launcher is bash exec'd into nspawn: SIGTERM to nspawn halts the container in order
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                if not is_running(h):
                    break
                time.sleep(0.1)
            else:   # the machine's init first: a killed nspawn alone would leave the container running
                for child in _children(pid):
                    os.kill(child, signal.SIGKILL)
                os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
        pidf.unlink(missing_ok=True)
    ns = _netns(h)
    _run("ip", "netns", "del", ns, check=False)
    _run("ip", "link", "del", ns, check=False)
    shutil.rmtree(f"/run/systemd/nspawn/propagate/{_machine(h)}", ignore_errors=True)
    if (h.dir / "merged").exists():
        _run("umount", "-l", h.dir / "merged", check=False)
    discard([h.dir / sub for sub in ("upper", "work", "merged")])


def discard(paths: list[Path]) -> None:
    """Remove directories without waiting for it: each is renamed into STATE/.trash at once (the same file system)
    and a detached ``rm -rf`` at the lowest priority deletes it.  A host's upper layer holds ~75,000 files (its
    venvs); unlinking them took ~10 s per host, nearly all of it waiting on the disk (1.5 s of CPU), and nothing
    needs them gone: the host's next start makes new directories.  One that cannot be moved is removed here."""
    trash = STATE / ".trash"
    moved = []
    for p in paths:
        if not os.path.lexists(p):
            continue
        trash.mkdir(mode=0o700, exist_ok=True)
        dest = trash / f"{p.parent.name}-{p.name}-{os.getpid()}-{time.monotonic_ns()}"
        try:
            os.rename(p, dest)
            moved.append(str(dest))
        except OSError:
            shutil.rmtree(p, ignore_errors=True)
    if moved:
        idle_io = [tools.system("ionice"), "-c", "3"] if tools.find("ionice") else []
        subprocess.Popen([*idle_io, tools.system("nice"), "-n", "19", tools.system("rm"), "-rf", "--one-file-system",
                          *moved],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)


def close_masters() -> None:
    """Close the controller's ssh ControlPersist masters (ours and Ansible's)."""
    for c in list(STATE.glob("cp-*")) + list((STATE / "cp-ansible").glob("*")):
        _run("ssh", "-o", f"ControlPath={c}", "-O", "exit", "x", check=False)


def stop(names: list[str] | None = None) -> list[str]:
    close_masters()
    stopped = []
    for h in hosts_on_disk():
        if names and h.name not in names:
            continue
        _stop_host(h)
        (h.dir / "role").unlink(missing_ok=True)
        stopped.append(h.name)
    if not any(is_running(h) for h in hosts_on_disk()):
        time.sleep(0.3)
        _run("ip", "link", "del", BRIDGE, check=False)
    return stopped


def status() -> list[dict]:
    return [{"name": h.name, "ip": h.ip, "running": is_running(h)} for h in hosts_on_disk()]


def ssh(h: str, command: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a command on a sandbox host as root (tests and knobs; deploys go through Ansible); on a sudo host
    through ``sudo``."""
    if is_sudo(h):
        command = "sudo -n sh -c " + shlex.quote(command)
    r = _run("ssh", "-F", STATE / "ssh_config", "-o", "BatchMode=yes", h, command, check=False, timeout=timeout)
    if check and r.returncode != 0:
        raise SandboxError(f"ssh {h} {command!r}: rc={r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def copy_to(h: str, src: Path | str, dest: str, mode: str = "0755") -> None:
    """Put a file from this machine onto a sandbox host (tests and rehearsals)."""
    landing = f"/tmp/.upload-{os.getpid()}" if is_sudo(h) else dest     # the login user may not write dest
    r = _run("scp", "-q", "-F", STATE / "ssh_config", "-o", "BatchMode=yes", src, f"{h}:{landing}", check=False)
    if r.returncode != 0:
        raise SandboxError(f"scp {src} {h}:{dest}: rc={r.returncode}\n{r.stderr}")
    if landing != dest:
        ssh(h, f"mv {shlex.quote(landing)} {shlex.quote(dest)} && chown root:root {shlex.quote(dest)}")
    ssh(h, f"chmod {mode} {dest}")


def set_knobs(h: str, gpus: dict | None = None, standin: dict | None = None) -> None:
    if gpus is not None:
        ssh(h, f"cat > {KNOBS_DIR}/gpus.json <<'EOF'\n{json.dumps(gpus)}\nEOF")
    if standin is not None:
        ssh(h, f"cat > {KNOBS_DIR}/standin.json <<'EOF'\n{json.dumps(standin)}\nEOF")
