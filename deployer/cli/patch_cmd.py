"""deployer patch check|diff|apply|revert: the EAGLE-3 patch engine on a local vLLM install."""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Annotated, Optional

import typer

from deployer.cli.targets import Json, die
from deployer.events import Exit
from deployer.host.module_utils import eagle3_patch as pe
from deployer.output import lit, out

app = typer.Typer(no_args_is_help=True, help="The EAGLE-3 patch engine (P1-P5) on a local vLLM install.")
Root = Annotated[Optional[str], typer.Option("--vllm-root", help="The vllm package directory, its site-packages "
                                                                  "or its venv.")]
Python = Annotated[Optional[str], typer.Option("--python", help="A venv's python; the vllm it imports is used.")]
STATE_WORDS = {"native": "native support, nothing to patch", "patched": "patched",
               "partial": "partially patched (an apply was interrupted; run apply)"}


def vllm_root(root: Optional[str], python: Optional[str]) -> str:
    if bool(root) == bool(python):
        die(Exit.USAGE, "give exactly one of --vllm-root DIR or --python VENV_PYTHON")
    if python:
        r = subprocess.run([python, "-c", "import importlib.util as u, os; "
                            "print(os.path.dirname(u.find_spec('vllm').origin))"], capture_output=True, text=True)
        if r.returncode != 0:
            die(Exit.USAGE, f"{python}: no vllm package importable ({r.stderr.strip()[-300:]})")
        return r.stdout.strip()
    try:
        return pe.vllm_root_of(root)
    except pe.PatchError as e:
        die(Exit.USAGE, str(e))


def _run(action: str, root: Optional[str], python: Optional[str], as_json: bool) -> None:
    where = vllm_root(root, python)
    try:
        if action == "check":
            res = pe.status(where)
            res["msg"] = STATE_WORDS.get(res["state"]) or f"needs {', '.join(res.get('needed', []))}"
        elif action == "diff":
            res = pe.apply(where, check_mode=True)
        elif action == "apply":
            res = pe.apply(where)
        else:
            res = pe.revert(where)
    except pe.PatchError as e:
        if as_json:
            sys.stdout.write(json.dumps({"ok": False, "error": str(e)}) + "\n")
            raise typer.Exit(int(Exit.FAILED)) from e
        die(Exit.FAILED, str(e))
    if as_json:
        sys.stdout.write(json.dumps(dict(res, ok=True, vllm_root=where)) + "\n")
        return
    if action == "diff":
        sys.stdout.write(res["diff"])
    fp = f" (fingerprint {res['fingerprint']})" if res.get("fingerprint") else ""
    out.print(lit(f"{where}: {res['msg']}{fp}"))


def _command(action: str, doc: str):
    def cmd(vllm_root: Root = None, python: Python = None, as_json: Json = False):
        _run(action, vllm_root, python, as_json)
    cmd.__doc__ = doc
    return cmd


for _action, _doc in (("check", "Which of P1-P5 this vLLM needs (changes nothing)."),
                      ("diff", "Unified diff of every edit apply would make (changes nothing)."),
                      ("apply", "Apply exactly the patches needed, all files or none."),
                      ("revert", "Restore the originals byte for byte.")):
    app.command(_action)(_command(_action, _doc))
