"""The controller's side of a sandbox: its SSH key, the servers' API key, and the client files (known_hosts with
the hosts' pinned keys, ssh_config, the Ansible inventory) that `deployer sandbox start` writes for running hosts."""
from __future__ import annotations

import os
from pathlib import Path

from deployer.sandbox import real_engine
from deployer.sandbox.checkpoints import write_drafter_dir
from deployer.sandbox.common import (
    CANARY_RANK_PATH,
    MODEL_DIR,
    STANDIN_PATH,
    STATE,
    SUDO_USER,
    Host,
    is_balancer,
    is_real,
    is_sudo,
    run,
)


def controller_key() -> Path:
    key = STATE / "id_ed25519"
    if not key.exists():
        STATE.mkdir(parents=True, exist_ok=True)
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "deployer-sandbox", "-f", key)
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
                                                        if is_sudo(h) else {}),
                             **(real_engine.settings() if is_real(h) else {}))
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
        # SANDBOX: the GPU canary's ranks play the simulated GPUs (the canary itself is the real one)
        "canary_rank_program": ["/usr/bin/python3", "-I", "-S", CANARY_RANK_PATH],
    }}}}}
    if lbs:   # SANDBOX: HAProxy from the controller's own package (the hosts share its file system)
        inv["all"]["children"]["balancer"] = {"hosts": lbs, "vars": {"deployer_sandbox": True}}
    (STATE / "inventory.yml").write_text(
        "# Written by `deployer sandbox start`.  Sandbox hosts only.\n" + yaml.safe_dump(inv, sort_keys=False))
    write_drafter_dir(STATE / "drafter")
    if any(is_real(h) for h in hosts):
        real_engine.write_controller_files()
    api_key()
