"""One seam per engine: everything the deployer knows about a serving engine, behind one small interface.

The plan (``deployer/plan.py``) asks the registered engine for what differs between engines - its settings, venv,
argv, environment, secrets, version rules, the GPU rules, where it reads a drafter's aux layers - and puts
``Engine.describe()`` into ``plan["engine"]``.  Roles and playbooks read ``plan.engine.*`` (``verifier``,
``patchable``, ``capability_probe``, ``log_rules``, ``drafts_metric``, ``health_timeout_seconds``) and never
compare engine names: a test enforces it (``tests/unit/test_engines.py``).  An engine is registered by name, as
SkyPilot registers its load-balancing policies: ``@register`` on a subclass of ``Engine``.

How to add an engine (docs/design.md, "Adding an engine"): a module here with an ``Engine`` subclass and
``@register`` (every module of this package is imported and registers itself); its argv builder (one place per
engine, like ``vllm_argv.py``); its verifier ``roles/verify/files/<name>_verify.py``; its log rules in
``module_utils/load_rules.py`` (``RULESETS``) and a stand-in in ``deployer/sandbox/`` for the sandbox.  No role
changes.
"""
from __future__ import annotations

from deployer.engines.base import (
    RECORDED_BEFORE_BACKENDS,
    REGISTRY,
    Engine,
    EngineError,
    argv_value,
    problems,
    register,
)

__all__ = ["RECORDED_BEFORE_BACKENDS", "REGISTRY", "Engine", "EngineError", "argv_value", "problems", "register",
           "get", "names", "describe", "engine_of_unit"]


def get(name: str) -> Engine:
    _load_builtin()
    if name not in REGISTRY:
        raise EngineError(f"backend: got {name!r}, expected one of {sorted(REGISTRY)}")
    return REGISTRY[name]


def names() -> list[str]:
    _load_builtin()
    return sorted(REGISTRY)


def describe(name: str) -> dict:
    """``plan.engine`` for a release recorded with only its engine's name (a rollback target's manifest)."""
    return get(name or RECORDED_BEFORE_BACKENDS).describe("")


def engine_of_unit(unit_text: str) -> str:
    """Which registered engine a unit file starts (its ExecStart names that engine's marker word), "vllm" when
    none says so."""
    _load_builtin()
    for name, eng in sorted(REGISTRY.items()):
        if eng.unit_marker and f'"{eng.unit_marker}"' in (unit_text or ""):
            return name
    return RECORDED_BEFORE_BACKENDS


_LOADED = False


def _load_builtin() -> None:
    """Import every module of this package once: each registers its engine (a new engine is a new module here)."""
    global _LOADED
    if not _LOADED:
        import importlib
        import pkgutil
        _LOADED = True
        for mod in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{mod.name}")
