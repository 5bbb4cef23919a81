#!/usr/bin/env python3
"""Ask the installed vLLM itself, with no GPU, whether this launch can work.

Run with the release's venv python on the host, before anything is (re)started:
  1. ``supports_eagle3()`` on KimiK25ForConditionalGeneration (the OUTER class the model
     runner checks) and DeepseekV2ForCausalLM;
  2. vLLM's own ``vllm serve`` argument parser accepts the rendered argv;
  3. vLLM's own config validation builds the engine config, speculative config
     included, against the model's and the drafter's config.json (catches a missing P4).
Platform (``--platform``): ``cpu`` (default) forces vLLM's CPU platform, as ``vllm bench`` does:
the checks then run anywhere, GPU host or not, and never touch a GPU (a CUDA context would take
device memory on GPU 0 while the live server holds it).  ``auto`` lets vLLM resolve its platform
(NVML only; on a GPU host: CUDA, so CUDA-specific validation runs too) and falls back to the CPU
platform when none is found.  The report says which platform validated the launch.
Engine cache (``--engine-cache FILE``): vLLM inspects a model class it has not loaded in a subprocess that imports
vLLM and torch again (``_run_in_subprocess`` in its model registry: ~9 s and a core each, twice for Kimi-K2.5's config
validation), and keeps the answer in ``$VLLM_CACHE_ROOT/modelinfos/``, keyed by the hash of the model's source file.
The checks run with a private, throw-away /tmp, so that cache was lost after every run.  The report carries it back
(``engine_cache``); the verify stage keeps it as root's file, one per venv, and hands it in here on the next run:
vLLM itself checks each entry's source hash and inspects afresh on any mismatch.
Prints one JSON object; exit 0 only when every check passed.
"""
import argparse
import json
import os
import re
import sys
import time
import traceback

STARTED = time.time()   # the report's seconds: the whole run, engine import included


def ran_as():
    """Who ran the checks (the verify stage runs them as the service user, in a transient sandboxed unit)."""
    import pwd
    uid = os.getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return {"uid": uid, "user": name}


MODELINFO_NAME = re.compile(r"[A-Za-z0-9_.-]+\.json")


def modelinfo_dir():
    """vLLM's own cache root (vllm/envs.py: VLLM_CACHE_ROOT, else $XDG_CACHE_HOME/vllm, else ~/.cache/vllm)."""
    root = os.environ.get("VLLM_CACHE_ROOT") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "vllm")
    return os.path.join(os.path.expanduser(root), "modelinfos")


def seed_modelinfos(path):
    """Write the entries of an earlier run's engine cache (JSON: {file name: modelinfo}) where vLLM looks for them;
    the entries seeded ({name: modelinfo}).  A missing or unreadable file seeds nothing (the first run of a venv)."""
    try:
        with open(path) as f:
            entries = json.load(f).get("modelinfos", {})
    except (OSError, ValueError, AttributeError):
        return {}
    d = modelinfo_dir()
    os.makedirs(d, exist_ok=True)
    seeded = {}
    for name, info in sorted(entries.items()):
        if MODELINFO_NAME.fullmatch(name) and isinstance(info, dict):
            with open(os.path.join(d, name), "w") as f:
                json.dump(info, f)
            seeded[name] = info
    return seeded


def modelinfos_now():
    d = modelinfo_dir()
    out = {}
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if MODELINFO_NAME.fullmatch(name):
            try:
                with open(os.path.join(d, name)) as f:
                    out[name] = json.load(f)
            except (OSError, ValueError):
                pass
    return out


def attention_backend_of(ns):
    """The attention backend the launch names (--attention-backend, or --attention-config's backend), as vLLM's
    enum name; None when the engine chooses."""
    b = getattr(ns, "attention_backend", None)
    if b is None:
        ac = getattr(ns, "attention_config", None)
        b = ac.get("backend") if isinstance(ac, dict) else getattr(ac, "backend", None)
    if b is None:
        return None
    return b.name if hasattr(b, "name") else str(b).upper()


def backend_runs_on(name, caps):
    """Ask the installed vLLM's own backend class (``supports_compute_capability``) about each compute capability.
    vLLM checks it only when it selects the backend on the GPU, after the restart; a backend whose module cannot be
    imported without a GPU driver here is reported unchecked, not refused."""
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.registry import AttentionBackendEnum  # every supported release (>= 0.16)
    if name not in AttentionBackendEnum.__members__:
        raise RuntimeError("attention backend %s: not one of this vLLM's (%s)"
                           % (name, ", ".join(AttentionBackendEnum.__members__)))
    try:
        cls = AttentionBackendEnum[name].get_class()
    except Exception as e:   # e.g. "Found no NVIDIA driver" importing a CUDA-only module on a GPU-less run
        return {"backend": name, "unchecked": "%s: %s" % (type(e).__name__, str(e)[:300])}
    verdict = {}
    for cap in caps:
        major, _, minor = cap.partition(".")
        if not (major.isdigit() and minor.isdigit()):
            raise RuntimeError("compute capability %r: expected MAJOR.MINOR as nvidia-smi prints it" % cap)
        verdict[cap] = bool(cls.supports_compute_capability(DeviceCapability(int(major), int(minor))))
    refused = sorted(c for c, ok in verdict.items() if not ok)
    if refused:
        raise RuntimeError("attention backend %s does not run on compute capability %s, which this host's GPUs have "
                           "(%s.supports_compute_capability of this vLLM; it would fail after the restart, when "
                           "the engine selects it): name another with --attention-backend, or none to let vLLM "
                           "choose" % (name, ", ".join(refused), cls.__name__))
    return {"backend": name, "class": cls.__name__, "compute_caps": verdict}


def env_problems(names, known, removed):
    """Why the release would not take these environment variables (the unit's own, by name), as its own
    ``vllm/envs.py`` says: one it removed (from 0.34 a set one is a start failure; vLLM's hint with it), or one it
    reads no such variable of (a typo, or gone: ``VLLM_USE_V2_MODEL_RUNNER`` in 0.34).  Only ``VLLM_*`` names are
    judged; ``known`` empty (a release without the table) judges none as unknown."""
    out = []
    for name in sorted(set(names)):
        if not name.startswith("VLLM_"):
            continue
        if name in removed:
            out.append("%s: this release removed it and refuses to start with it set (%s)" % (name, removed[name]))
        elif known and name not in known:
            out.append("%s: this release reads no such variable (a typo, or one it no longer has)" % name)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--argv-json", required=True, help="file with the rendered argv (launcher first)")
    ap.add_argument("--skip-config", action="store_true")
    ap.add_argument("--platform", choices=["cpu", "auto"], default="cpu")
    ap.add_argument("--managed-dest", action="append", default=[], dest="managed_dests",
                    help="a parser destination the deployer sets from its own settings (the engine's managed_dests, "
                         "deployer/engines: repeated; extra words may change none)")
    ap.add_argument("--extra-args", type=int, default=0,
                    help="how many words at the argv's end are the operator's extra_args: vLLM's own parser must "
                    "not see them set any flag the deployer manages, whatever the spelling")
    ap.add_argument("--drafter-dir", help="read the drafter's config.json from here instead of the argv's path "
                    "(its config shipped ahead of the weights: the checks run while the weights are copied)")
    ap.add_argument("--engine-cache", help="an earlier run's engine cache for this venv (see the module's doc)")
    ap.add_argument("--compute-cap", action="append", default=[],
                    help="a compute capability of the host's GPUs (nvidia-smi: 12.0); an attention backend the "
                    "launch names is asked whether it runs there (repeatable)")
    ap.add_argument("--env-name", action="append", default=[], dest="env_names",
                    help="the name of a variable the server's unit sets (repeatable; values never come here)")
    a = ap.parse_args()
    if a.extra_args and not a.managed_dests:
        ap.error("--extra-args without --managed-dest: nothing to hold the extra words to")
    with open(a.argv_json) as f:
        argv = json.load(f)
    serve_at = argv.index("serve")
    serve_argv = argv[serve_at:]
    spec = None
    report = {"checks": [], "ok": True, "ran_as": ran_as()}
    if "--speculative-config" in serve_argv:
        at = serve_argv.index("--speculative-config") + 1
        spec = json.loads(serve_argv[at])
        if a.drafter_dir and spec.get("model"):
            report["drafter_config_from"] = a.drafter_dir
            serve_argv[at] = json.dumps(dict(spec, model=a.drafter_dir))

    def check(name, fn):
        t0 = time.time()
        try:
            detail = fn()
            report["checks"].append({"name": name, "ok": True, "detail": detail, "seconds": round(time.time() - t0, 2)})
            return True
        except BaseException as e:  # report vLLM's own error text
            msg = "%s: %s" % (type(e).__name__, e)
            if isinstance(e, SystemExit):
                msg = "argument parser exited with status %s" % e.code
            report["checks"].append({"name": name, "ok": False, "error": msg,
                                     "traceback": traceback.format_exc()[-3000:],
                                     "seconds": round(time.time() - t0, 2)})
            report["ok"] = False
            return False

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    seeded = seed_modelinfos(a.engine_cache) if a.engine_cache else {}
    from vllm import platforms
    resolved = None
    if a.platform == "auto":
        p = platforms.current_platform   # vLLM's own resolution (NVML probes; no CUDA context)
        if not p.is_unspecified():
            resolved = p
    if resolved is None:
        from vllm.platforms.cpu import CpuPlatform
        platforms._current_platform = CpuPlatform()
        platforms.current_platform = CpuPlatform()
        report["platform"] = "cpu (%s)" % ("forced" if a.platform == "cpu" else "auto: no accelerator found")
    else:
        report["platform"] = "%s (auto)" % (type(resolved).__name__,)
    import vllm
    report["vllm_version"] = vllm.__version__

    if a.env_names:
        def environment():
            import vllm.envs as envs
            bad = env_problems(a.env_names, set(getattr(envs, "environment_variables", None) or {}),
                               dict(getattr(envs, "removed_environment_variables", None) or {}))
            if bad:
                raise ValueError("; ".join(bad))
            return {"variables": sorted(n for n in a.env_names if n.startswith("VLLM_"))}
        check("environment", environment)

    if spec and spec.get("method") == "eagle3":
        def eagle3():
            from vllm.model_executor.models.deepseek_v2 import DeepseekV2ForCausalLM
            from vllm.model_executor.models.interfaces import supports_eagle3
            from vllm.model_executor.models.kimi_k25 import KimiK25ForConditionalGeneration
            got = {"KimiK25ForConditionalGeneration": bool(supports_eagle3(KimiK25ForConditionalGeneration)),
                   "DeepseekV2ForCausalLM": bool(supports_eagle3(DeepseekV2ForCausalLM))}
            if not all(got.values()):
                raise RuntimeError("Model does not support EAGLE3 interface but aux_hidden_state_outputs was "
                                   "requested (supports_eagle3: %s)" % got)
            return got
        check("supports_eagle3", eagle3)

    holder = {}

    def parse_with_vllm(words):
        from vllm.entrypoints.cli.serve import ServeSubcommand
        from vllm.utils.argparse_utils import FlexibleArgumentParser
        parser = FlexibleArgumentParser(prog="vllm")
        subparsers = parser.add_subparsers(required=True, dest="subparser")
        ServeSubcommand().subparser_init(subparsers)
        return parser.parse_args(words)

    def parse():
        # the function `vllm serve` itself calls, from the module that defines the subcommand: vLLM moved it
        # (entrypoints/openai/cli_args.py up to 0.28; launchers/cli_args.py in 0.29, common/cli_args.py in 0.33)
        from vllm.entrypoints.cli.serve import validate_parsed_serve_args
        ns = parse_with_vllm(list(serve_argv))
        validate_parsed_serve_args(ns)
        if getattr(ns, "model_tag", None):
            ns.model = ns.model_tag
        holder["args"] = ns
        return {"model": ns.model, "tensor_parallel_size": ns.tensor_parallel_size,
                "speculative_config": dict(ns.speculative_config or {})}
    parsed = check("argument_parser", parse)

    backend = attention_backend_of(holder.get("args")) if parsed else None
    if backend and a.compute_cap:
        def attention_backend():
            return backend_runs_on(backend, a.compute_cap)
        check("attention_backend", attention_backend)

    if parsed and a.extra_args > 0:
        def managed_flags():
            # what vLLM's own parser makes of the extra words (prefixes, dotted sub-keys, --config FILE, --no-X):
            # none may change a destination the deployer sets from its own settings
            base = vars(parse_with_vllm(list(serve_argv[:-a.extra_args])))
            if base.get("model_tag"):
                base["model"] = base["model_tag"]      # as parse() does for the full argv
            full = vars(holder["args"])
            changed = sorted(d for d in set(a.managed_dests) if d in base and base.get(d) != full.get(d))
            if changed:
                raise RuntimeError("extra_args %s set %s, which the deployer manages (set its own variable): %s"
                                   % (serve_argv[-a.extra_args:], ", ".join(changed),
                                      "; ".join("%s: %r -> %r" % (d, base.get(d), full.get(d)) for d in changed)))
            return {"extra_args": serve_argv[-a.extra_args:],
                    "managed_unchanged": sorted(set(a.managed_dests) & set(base))}
        check("managed_flags", managed_flags)

    if parsed and not a.skip_config:
        def config():
            from vllm.engine.arg_utils import AsyncEngineArgs
            ns = holder["args"]
            ns.skip_tokenizer_init = True
            if hasattr(ns, "swap_space"):
                ns.swap_space = 0  # CPU-platform artefact only (4 GiB x TP would exceed this machine's RAM)
            cfg = AsyncEngineArgs.from_cli_args(ns).create_engine_config()
            holder["config"] = cfg
            sc = cfg.speculative_config
            return {"speculative_method": getattr(sc, "method", None),
                    "num_speculative_tokens": getattr(sc, "num_speculative_tokens", None),
                    "text_model_type": cfg.model_config.hf_text_config.model_type}
        if check("config_validation", config):
            def model_loader():
                # the release's own checks of the load settings, which it makes when it builds the loader at the
                # start of the load (after the restart): building it reads no weights and needs no GPU.  Recorded
                # on an H200 (docs/real-engine.md): 0.24+ refuses the multi-thread loader with any
                # --safetensors-load-strategy but lazy there, after the API server was up
                from vllm.model_executor.model_loader import get_model_loader
                load = holder["config"].load_config
                return {"loader": type(get_model_loader(load)).__name__,
                        "safetensors_load_strategy": getattr(load, "safetensors_load_strategy", None)}
            check("model_loader", model_loader)

    now = modelinfos_now()
    report["engine_cache"] = {"seeded": sorted(seeded), "changed": now != seeded, "modelinfos": now}
    report["seconds"] = round(time.time() - STARTED, 2)

    sys.stdout.write("DEPLOYER-VERIFY " + json.dumps(report, default=str) + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
