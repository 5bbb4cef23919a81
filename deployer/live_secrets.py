"""The live secrets' layout and contents (docs/security.md, "Secrets"): one root-only directory, never a release.
Every engine's secret file is written whatever runs now, so that a rollback across engines finds its key."""
from __future__ import annotations

from deployer import engines
from deployer.host.module_utils import envfile

SECRETS_ENV_FILE = "server.env"


def live_secrets(dirs: dict, service: str) -> dict:
    """Where the live secrets are (docs/security.md, "Secrets"): one root-only directory, never a release.  The
    unit drop-in hands them to whatever release runs, so a rollback restores code and flags, never old secrets
    (a later EnvironmentFile= overrides an earlier one: a release rendered before secrets moved out of releases
    runs with the live ones too)."""
    d = dirs["secrets"]
    env_file = f"{d}/{SECRETS_ENV_FILE}"
    return {"dir": d, "env_file": env_file,
            "dropin_path": f"/etc/systemd/system/{service}.service.d/deployer-secrets.conf",
            "dropin": ("# Managed by deployer: the live secrets, for whatever release runs (docs/security.md).\n"
                       f"[Service]\nEnvironmentFile={env_file}\n")}


def secret_files(api_key: str, hf_token: str) -> dict:
    """The contents of the live secret files (written 0600 by the start stage; never printed): the server's
    environment (each engine's API-key variable, the Hugging Face token) and each engine's own secret files
    (SGLang's --config YAML with its key).  Every engine's are written whatever runs now, so that a rollback
    across engines finds its key."""
    every = [engines.get(n) for n in engines.names()]
    lines = ["# Managed by deployer.  Mode 0600: the live secrets (docs/security.md)."]
    if api_key:
        lines += [f"{var}=" + envfile.quote(api_key) for var in dict.fromkeys(e.api_key_env for e in every) if var]
    if hf_token:
        lines.append("HF_TOKEN=" + envfile.quote(hf_token))
    files = {SECRETS_ENV_FILE: "\n".join(lines) + "\n"}
    for e in every:
        files.update(e.secret_files(api_key))
    return files
