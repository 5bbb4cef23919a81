"""The engine interface and its registry (``@register``); the engines' modules import this, never the package's
``__init__`` (which loads them: no import runs in a circle)."""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

# The engine of a release recorded before the deployer had a choice of engines (its manifest names none, its unit
# no marker): vLLM.  A fact about old records, not the setting's default (that is roles/deployer/defaults/main.yml).
RECORDED_BEFORE_BACKENDS = "vllm"


class EngineError(ValueError):
    """Bad deploy input for an engine; the message names the setting, the value and what is expected."""


class Engine:
    """The interface.  Class attributes describe the engine; methods take the operator's settings ``s`` (the
    ``deployer_*`` variables without the prefix) and return what the plan needs."""

    name = ""                  # the value of deployer_backend
    label = ""                 # what messages call it
    package = ""               # the PyPI package the install stage installs
    program = ""               # the venv's console script that serves
    version_setting = ""       # the setting that pins its release
    extra_args_setting = ""    # the setting of free-form argv words
    patchable = False          # the patch stage applies the EAGLE-3 patches (else it checks the source)
    capability_probe = False   # the patch stage reads the installed source for what this deploy needs
    verifier = ""              # roles/verify/files/<verifier>: the engine's own checks, GPU-less
    log_rules = ""             # load_rules.RULESETS key: the load phases as this engine logs them
    drafts_metric = ""         # the /metrics counter of EAGLE-3 drafts (the smoke test's proof it is on)
    metrics_rules = ""         # spec_metrics.RULES key: how its /metrics say what EAGLE-3 drafted and accepted
    unit_marker = ""           # a word only this engine's ExecStart has (to tell which engine a unit starts)
    health_timeout_seconds = 2.0   # how long one GET /health may take before the watch counts it unanswered
    memory_plan = False        # preflight plans its GPU memory from its argv (deployer/memory_plan.py: vLLM's rules)
    # the venv's CUDA libraries that hold the model's kernels (globs under site-packages -> what they hold): the verify
    # stage reads which carry only PTX for the host's GPUs, and so the driver they need (deployer/driver_floor.py)
    cuda_libraries: dict = {}
    # the GPU canary before the restart (roles/canary): whether this engine runs on NVIDIA GPUs at all, and which of
    # the release's own kernels it asks for (gpu_canary.py PROBES: the code a PTX-only build JIT-compiles at load)
    gpu_canary = True
    canary_probes: tuple = ()
    # programs its kernels are compiled with at run time beyond Triton's C compiler (deployer/host_checks.py
    # JIT_ADVICE); the venv's bin is then first on the unit's PATH, as in an activated venv (the tools are run by name)
    jit_toolchain: tuple = ()
    api_key_env = ""           # the environment variable it reads its API key from (the live 0600 env file), if any
    # Whether it loads the deployer's API guard (roles/render/files/api_guard.py: /v1 with the key, /health and
    # /metrics, nothing else), and what it answers without the guard: the paths its own key check leaves open
    # (docs/security.md).  ``exposure`` says it for a plan and for a recorded release (its argv).
    api_guard = False
    keyed_paths = "every path"
    unguarded_open = "none"
    # the flags its argv builder owns (extra words may not set them, under any spelling: argv.check_extra_args), and
    # the parser destinations of its positional words; the verifier gets the destinations (managed_dests) on its
    # command line, so that its check of the engine's own parser never keeps a copy of its own
    managed_flags: tuple = ()
    positional_dests: tuple = ()

    # -- what the plan asks
    def version(self, s: dict) -> str:
        raise NotImplementedError

    def venv(self, s: dict, root: str, version: str) -> tuple[str, bool]:
        """(venv path, patched)"""
        return f"{root}/venvs/{self.name}-{version}", False

    def credentials(self, s: dict) -> dict:
        """Files systemd hands the service (LoadCredential=): {name: file in the live secrets dir}."""
        return {}

    def secret_files(self, api_key: str) -> dict:
        """Its own live secret files beyond the env file ({name: content}; written 0600 whatever engine runs)."""
        return {}

    def argv(self, s: dict, venv: str, drafter: dict | None, credentials: dict) -> list[str]:
        raise NotImplementedError

    def env(self, s: dict, server_cache: str) -> dict:
        """The engine's own (non-secret) environment; the caches in the shared server cache."""
        return {}

    def refusal(self, version: str, speculative: bool, drafter: dict | None, s: dict) -> str:
        """Why this release cannot serve Kimi-K2.5 here, as far as its version tells ("" when it can)."""
        return ""

    def sm120_refusals(self, argv: list[str], compute_caps: list[str]) -> list[str]:
        """What in the launch cannot run on these GPUs (compute capability 12.x: RTX PRO 6000 Blackwell)."""
        return []

    def draft_tokens_per_step(self, s: dict) -> int:
        """The drafts one verify step proposes (the smoke test's acceptance rate is accepted / proposed)."""
        return int(s["num_speculative_tokens"])

    def speculative_of(self, argv: list[str]) -> tuple[bool, int]:
        """(EAGLE-3 on, drafts per verify step) as a recorded release's argv says (a rollback target's plan:
        ``plan.release_plan``); the inverse of what ``argv`` renders for ``speculative`` and
        ``draft_tokens_per_step``."""
        return False, 0

    def aux_layers(self, drafter_cfg: dict, num_layers: int, version: str = "") -> tuple[list[int], str]:
        """The target layers this release captures for an EAGLE-3 drafter, and where it took them from."""
        return [2, num_layers // 2, num_layers - 3], "the target's default (2, L//2, L-3)"

    def exported_elsewhere(self, drafter_cfg: dict, version: str = ""):
        """Layer ids the drafter's config names where this release does not read them (a warning)."""
        return None

    def built_fc_inputs(self, drafter_cfg: dict, version: str = "") -> int | None:
        """The fc input size this release builds for the drafter when it loads it (its weights must match), or
        None when it takes the checkpoint's."""
        return None

    def loads_d2t_at_full_vocab(self, version: str = "") -> bool:
        """Whether this release loads a drafter that ships ``d2t`` although its draft vocabulary is the target's
        whole vocabulary (an identity map)."""
        return True

    def proposer_reads(self, target_cfg: dict, version: str = "") -> list[str]:
        """Fields of the target's config this release's EAGLE proposer reads when it loads the drafter (after the
        target's weights): each must be there, or the load dies at its end."""
        return []

    def guarded(self, argv: list[str]) -> bool:
        """Whether this argv loads the deployer's API guard."""
        return False

    def exposure(self, argv: list[str], keyed: bool, loopback: bool) -> str:
        """What the server answers, and to whom: one line for ``status``, ``releases`` and the release record."""
        where = "on loopback only: " if loopback else ""
        if self.guarded(argv):
            return (f"{where}/v1 {'with the API key' if keyed else 'without a key'}, /health and /metrics; every "
                    "other path refused (API guard)")
        if not keyed:
            return f"{where}every path without a key"
        return f"{where}{self.keyed_paths} with the API key; without one: {self.unguarded_open}"

    def managed_dests(self) -> list[str]:
        """The parser destinations of ``managed_flags`` (argparse's rule: ``--a-b`` -> ``a_b``; a short alias has
        its long flag's; ``--config`` expands into other flags and is none)."""
        return sorted({f[2:].replace("-", "_") for f in self.managed_flags if f.startswith("--") and f != "--config"}
                      | set(self.positional_dests))

    def describe(self, version: str) -> dict[str, Any]:
        """What ``plan["engine"]`` holds (JSON): what the roles read."""
        return {"name": self.name, "label": self.label, "package": self.package, "version": version,
                "patchable": self.patchable, "capability_probe": self.capability_probe, "verifier": self.verifier,
                "log_rules": self.log_rules, "drafts_metric": self.drafts_metric, "metrics_rules": self.metrics_rules,
                "health_timeout_seconds": self.health_timeout_seconds, "cuda_libraries": dict(self.cuda_libraries),
                "gpu_canary": self.gpu_canary, "canary_probes": list(self.canary_probes),
                "jit_toolchain": list(self.jit_toolchain), "managed_dests": self.managed_dests()}


REGISTRY: dict[str, Engine] = {}

# What every engine says for itself: an empty one would be a silent default (a release read with another engine's
# rules, a smoke that skips its EAGLE-3 check).  Members and methods, each named in the refusal.
REQUIRED = ("name", "label", "package", "program", "version_setting", "extra_args_setting", "verifier", "log_rules",
            "drafts_metric", "metrics_rules")
OWN_METHODS = ("version", "argv", "speculative_of")
_REPO = Path(__file__).resolve().parents[2]
VERIFIERS = _REPO / "roles" / "verify" / "files"
CANARY = _REPO / "roles" / "canary" / "files" / "gpu_canary.py"


@functools.lru_cache(maxsize=1)
def canary_probes() -> frozenset:
    """The probes the GPU canary knows (its ``PROBES`` table), read once."""
    return frozenset(re.findall(r'"(\w+)": _probe_', CANARY.read_text()))


def problems(cls) -> list[str]:
    """What an engine class leaves unsaid or names wrong (empty when it can register)."""
    from deployer.host.module_utils import spec_metrics
    from deployer.host.module_utils.load_rules import RULESETS
    out = [f"{a} is empty" for a in REQUIRED if not getattr(cls, a, "")]
    out += [f"{m}() is the base class's: say it for this engine" for m in OWN_METHODS
            if getattr(cls, m) is getattr(Engine, m)]
    if cls.log_rules and cls.log_rules not in RULESETS:
        out.append(f"log_rules {cls.log_rules!r}: expected one of {sorted(RULESETS)} (module_utils/load_rules.py)")
    if cls.metrics_rules and cls.metrics_rules not in spec_metrics.RULES:
        out.append(f"metrics_rules {cls.metrics_rules!r}: expected one of {sorted(spec_metrics.RULES)} "
                   "(module_utils/spec_metrics.py)")
    if cls.verifier and not (VERIFIERS / cls.verifier).is_file():
        out.append(f"verifier {cls.verifier!r}: no such file in roles/verify/files")
    out += [f"canary probe {p!r}: not one of the canary's {sorted(canary_probes())}" for p in cls.canary_probes
            if p not in canary_probes()]
    # `deployer watch` tells a unit's engine by its marker word; a unit with none is read by the rules of the
    # engine that was the only one before (a fork logging as that engine does needs none)
    if not cls.unit_marker and cls.log_rules != RECORDED_BEFORE_BACKENDS:
        out.append("unit_marker is empty: a unit of this engine would be read with another engine's log rules")
    out += [f"unit_marker {cls.unit_marker!r} is engine {n}'s too" for n, e in sorted(REGISTRY.items())
            if cls.unit_marker and e.unit_marker == cls.unit_marker and n != cls.name]
    return out


def register(cls):
    """Class decorator: register an engine under its name (a later registration of the same name replaces it),
    once it says everything an engine must (``problems``): else EngineError naming what is missing."""
    bad = problems(cls)
    if bad:
        raise EngineError(f"engine {cls.__name__} ({cls.name or 'no name'}) cannot register: " + "; ".join(bad))
    REGISTRY[cls.name] = cls()
    return cls


def argv_value(argv: list[str], *flags: str) -> str | None:
    """The value of the last of ``flags`` in an argv (``--flag value`` or ``--flag=value``), None when absent."""
    argv = [str(a) for a in (argv or [])]
    got = None
    for i, a in enumerate(argv):
        for f in flags:
            if a == f and i + 1 < len(argv):
                got = argv[i + 1]
            elif a.startswith(f + "="):
                got = a.split("=", 1)[1]
    return got
