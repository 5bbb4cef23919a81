"""What names things (the identity hashes): a release's id, the patched venv's patch-engine id, the log-line
wrapper's content-named path, the templates' hash.  An unchanged deploy computes the same names, so it changes
nothing and restarts nothing; ``tests/unit/test_promises.py`` pins the default settings' release id."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

# The unit and env-file templates are part of what names a release: a changed template is a new release (never the
# same id with different files), and a release's recorded unit is the one it was verified with.  The log-line
# wrapper the unit runs is named by its content (line_splitter_path), and that path is a release input too.
_REPO = Path(__file__).resolve().parent.parent
_TEMPLATES = [_REPO / "templates" / n for n in ("engine.service.j2", "engine.env.j2")]
_LINE_SPLITTER = _REPO / "roles" / "render" / "files" / "journal_lines.py"
_API_GUARD = _REPO / "roles" / "render" / "files" / "api_guard.py"


def line_splitter_sha256() -> str:
    return hashlib.sha256(_LINE_SPLITTER.read_bytes()).hexdigest()


def line_splitter_path(bin_dir: str) -> str:
    """Where the unit's log-line wrapper lives on the host: named by its content (root's bin/, readable by the
    service user), so every release keeps running the exact wrapper it was rendered with."""
    return f"{bin_dir}/journal_lines-{line_splitter_sha256()[:12]}.py"


def api_guard_module(bin_dir: str) -> tuple[str, str]:
    """The API guard vLLM loads with ``--middleware`` (roles/render/files/api_guard.py): its path on the host and its
    module name, both named by its content (a release keeps the guard it was rendered with)."""
    module = "deployer_api_guard_" + hashlib.sha256(_API_GUARD.read_bytes()).hexdigest()[:12]
    return f"{bin_dir}/{module}.py", module


# The host's state keeper (roles/render/files/state_keeper/) and the host module_utils it runs, as it imports them
# there: under an ``ansible/module_utils`` package of its own
_KEEPER_UTILS = ("__init__", "host_state", "host_io", "journal_follow", "engine_logs", "load_rules", "log_lines",
                 "root_causes")


def _host_program(bin_dir: str, folder: str, script: Path, utils: tuple[str, ...]) -> tuple[str, dict[str, Path]]:
    """A program root runs on the host from its own folder of root's bin/, with the host module_utils it imports
    there under an ``ansible/module_utils`` package of its own: (folder, {path on the host: source here})."""
    src = {script.name: script, "ansible/__init__.py": _REPO / "deployer" / "host" / "__init__.py"}
    src.update({f"ansible/module_utils/{n}.py": _REPO / "deployer" / "host" / "module_utils" / f"{n}.py"
                for n in utils})
    d = f"{bin_dir}/{folder}"
    return d, {f"{d}/{k}": v for k, v in src.items()}


def state_keeper_files(bin_dir: str) -> tuple[str, dict[str, Path]]:
    """The keeper's folder on the host (root's bin/) and its files: {path on the host: source here}.  Not named by
    content and not a release input: a new keeper reaches a live host without a new release (the no-op check compares
    each file; the render stage writes them; the keeper restarts itself when its files change)."""
    return _host_program(bin_dir, "state-keeper", _REPO / "roles" / "render" / "files" / "state_keeper" /
                         "state_keeper.py", _KEEPER_UTILS)


def gpu_gate_files(bin_dir: str) -> tuple[str, dict[str, Path]]:
    """The GPU health gate systemd runs before every start of the engine (roles/render/files/gpu_gate/gpu_gate.py)
    and the module_utils it imports: not a release input, as the keeper's."""
    return _host_program(bin_dir, "gpu-gate", _REPO / "roles" / "render" / "files" / "gpu_gate" / "gpu_gate.py",
                         ("__init__", "gpu_health"))


def templates_hash() -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in _TEMPLATES)).hexdigest()[:12]

_PATCH_ENGINE = _REPO / "deployer" / "host" / "module_utils" / "eagle3_patch.py"


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


def release_id(plan: dict, patch_fingerprint: str | None) -> str:
    """A release is named by the hash of everything that defines it: an unchanged deploy renders the
    same release, changes nothing and restarts nothing."""
    return content_hash(dict(plan["release_inputs"], patch=patch_fingerprint))
