#!/usr/bin/env python3
"""Ask the installed SGLang itself, with no GPU, whether this launch can work.

Run with the release's venv python on the host, before anything is (re)started:
  1. SGLang's own ``sglang serve`` argument parser (``prepare_server_args``) accepts the rendered argv
     (a misspelt or ambiguous flag: argparse's own message, as ``sglang serve`` would print it);
  2. SGLang's own server-args resolution (``ServerArgs.resolve_once``; ``check_server_args`` and
     ``__post_init__`` on releases before 0.5.19) with the device forced to CUDA, against the model's and the
     drafter's local config.json (a drafter path without config.json fails here, with SGLang's message);
  3. the EAGLE-3 hook on the OUTER class SGLang calls (``KimiK25ForConditionalGeneration`` must define
     ``set_eagle3_layers_to_capture``), imported from this venv.
The API key word (``{credentials}/sglang-secrets.yaml``, the unit's credentials directory) is replaced by a
throw-away file holding a placeholder key: the real key is never read here.
What SGLang cannot check without the GPU (attention backends on sm_120) preflight checks from compute_cap.
Prints one ``DEPLOYER-VERIFY {json}`` line (same report as vllm_verify.py); exit 0 only when every check passed.
"""
import argparse
import json
import os
import sys
import tempfile
import time
import traceback

STARTED = time.time()   # the report's seconds: the whole run, engine import included

CREDENTIALS_TOKEN = "{credentials}"




def ran_as():
    """Who ran the checks (the verify stage runs them as the service user, in a transient sandboxed unit)."""
    import pwd
    uid = os.getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return {"uid": uid, "user": name}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--argv-json", required=True, help="file with the rendered argv (launcher first)")
    ap.add_argument("--platform", choices=["cpu", "auto"], default="cpu", help="accepted for the role's sake; "
                    "SGLang resolves with the device forced to cuda")
    ap.add_argument("--managed-dest", action="append", default=[], dest="managed_dests",
                    help="a parser destination the deployer sets from its own settings (the engine's managed_dests, "
                         "deployer/engines: repeated; extra words may change none)")
    ap.add_argument("--extra-args", type=int, default=0,
                    help="how many words at the argv's end are the operator's extra_args: SGLang's own parser must "
                    "not see them set any flag the deployer manages, whatever the spelling")
    ap.add_argument("--drafter-dir", help="read the drafter's config.json from here instead of the argv's path "
                    "(its config shipped ahead of the weights: the checks run while the weights are copied)")
    ap.add_argument("--engine-cache", help="accepted for the role's sake: SGLang's checks keep nothing between runs "
                    "(vllm_verify.py keeps vLLM's model-registry answers)")
    ap.add_argument("--compute-cap", action="append", default=[], help="accepted for the role's sake: SGLang's "
                    "attention backends on sm_120 are refused by the preflight (engines/sglang_argv.py)")
    ap.add_argument("--env-name", action="append", default=[], help="accepted for the role's sake: SGLang keeps no "
                    "table of the variables it reads to hold the unit's names to")
    a = ap.parse_args()
    if a.extra_args and not a.managed_dests:
        ap.error("--extra-args without --managed-dest: nothing to hold the extra words to")
    with open(a.argv_json) as f:
        argv = json.load(f)
    serve_argv = argv[argv.index("serve") + 1:]
    tmp = tempfile.mkdtemp(prefix="deployer-verify-")
    with open(os.path.join(tmp, "sglang-secrets.yaml"), "w") as f:
        f.write("api-key: deployer-verify-placeholder\n")
    serve_argv = [w.replace(CREDENTIALS_TOKEN, tmp, 1) if w.startswith(CREDENTIALS_TOKEN + "/") else w
                  for w in serve_argv]
    report = {"checks": [], "ok": True, "platform": "cuda (forced; no GPU touched)", "ran_as": ran_as()}
    if a.drafter_dir and "--speculative-draft-model-path" in serve_argv:
        serve_argv[serve_argv.index("--speculative-draft-model-path") + 1] = a.drafter_dir
        report["drafter_config_from"] = a.drafter_dir
    state = {}

    def check(name, fn):
        t0 = time.time()
        try:
            detail = fn()
            report["checks"].append({"name": name, "ok": True, "detail": detail, "seconds": round(time.time() - t0, 2)})
            return True
        except BaseException as e:  # report SGLang's own error text
            msg = "%s: %s" % (type(e).__name__, e)
            if isinstance(e, SystemExit):
                lines = state.get("stderr", "").strip().splitlines()
                msg = "sglang serve's argument parser exited with status %s: %s" % (e.code, lines[-1] if lines else "")
            report["checks"].append({"name": name, "ok": False, "error": msg,
                                     "traceback": traceback.format_exc()[-3000:],
                                     "seconds": round(time.time() - t0, 2)})
            report["ok"] = False
            return False

    import importlib.metadata as md
    report["engine_version"] = md.version("sglang")
    from sglang.srt.server_args import prepare_server_args

    def parse():
        import contextlib
        import io
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                state["args"] = prepare_server_args(serve_argv)
        finally:
            state["stderr"] = err.getvalue()
            sys.stderr.write(state["stderr"])
        return "sglang serve accepts %d words" % len(serve_argv)

    def resolve():
        sa = state["args"]
        sa.device = "cuda"       # GPU-less: SGLang would find no accelerator; the host has CUDA
        if hasattr(sa, "resolve_once"):
            sa.resolve_once()
        elif hasattr(sa, "check_server_args"):
            sa.check_server_args()
        return {"attention_backend": getattr(sa, "attention_backend", None),
                "speculative_algorithm": getattr(sa, "speculative_algorithm", None),
                "speculative_draft_model_path": getattr(sa, "speculative_draft_model_path", None),
                "max_running_requests": getattr(sa, "max_running_requests", None)}

    def eagle3():
        from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration as K
        if not callable(getattr(K, "set_eagle3_layers_to_capture", None)):
            raise RuntimeError("Model KimiK25ForConditionalGeneration does not implement "
                               "set_eagle3_layers_to_capture (SGLang would say so after the weight load)")
        return {"KimiK25ForConditionalGeneration.set_eagle3_layers_to_capture": True}

    def managed_flags():
        # what SGLang's own parser makes of the extra words (prefixes, --config FILE): none may change a setting
        # the deployer sets from its own variables
        base = vars(prepare_server_args(list(serve_argv[:-a.extra_args])))
        full = vars(state["args"])
        changed = sorted(d for d in set(a.managed_dests) if d in base and base.get(d) != full.get(d))
        if changed:
            raise RuntimeError("sglang_extra_args %s set %s, which the deployer manages (set its own variable)"
                               % (serve_argv[-a.extra_args:], ", ".join(changed)))
        return {"extra_args": serve_argv[-a.extra_args:]}

    if check("sglang_argparse", parse):
        if a.extra_args > 0:
            check("managed_flags", managed_flags)
        check("sglang_server_args", resolve)
    if "--speculative-algorithm" in serve_argv:
        check("eagle3_hook", eagle3)
    report["seconds"] = round(time.time() - STARTED, 2)
    print("DEPLOYER-VERIFY " + json.dumps(report))
    sys.stdout.flush()
    os._exit(0 if report["ok"] else 1)   # SGLang's imports leave threads behind


if __name__ == "__main__":
    main()
