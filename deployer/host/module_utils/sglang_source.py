# -*- coding: utf-8 -*-
"""What an installed SGLang can serve, read from its source (``ast``, no import: importing SGLang takes ~15 s
and wants a GPU stack).  Standard library only: used on the host by the ``sglang_capability`` module and on the
controller by the tests.

SGLang checks EAGLE-3 support only AFTER the 25-minute weight load (``Model X does not implement
set_eagle3_layers_to_capture``), so the deployer asks the installed source first:
  * the target's class (``KimiK25ForConditionalGeneration`` in ``srt/models/kimi_k25.py``, SGLang >= 0.5.9);
  * its EAGLE-3 hook ``set_eagle3_layers_to_capture`` defined ON that class (0.5.10+; the outer class is the one
    SGLang calls: a hook on the inner DeepseekV3 model alone does not count);
  * the drafter's class (its config.json ``architectures[0]``) defined in some ``srt/models/*.py``
    (``Eagle3DeepseekV2ForCausalLM``, the MLA drafter's, from 0.5.12).
"""
from __future__ import annotations

import ast
import glob
import os

TARGET_CLASS = "KimiK25ForConditionalGeneration"
HOOK = "set_eagle3_layers_to_capture"


class SourceError(Exception):
    pass


def sglang_root_of(venv):
    """The ``sglang`` package directory inside a venv (or the directory itself)."""
    if os.path.isfile(os.path.join(venv, "srt", "server_args.py")):
        return venv
    hits = sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "sglang")))
    if not hits:
        raise SourceError("no SGLang package under %s (lib/python3*/site-packages/sglang)" % venv)
    return hits[-1]


def version_of(root):
    for meta in sorted(glob.glob(os.path.join(os.path.dirname(root), "sglang-*.dist-info", "METADATA"))):
        with open(meta) as f:
            for line in f:
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    return None


def _classes(path):
    try:
        with open(path) as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return {}
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return out


def capability(root, drafter_architecture=""):
    """{version, target_class, eagle3_hook, drafter_class, drafter_architecture, problems[]}: ``problems`` empty
    when this SGLang can serve Kimi-K2.5 with this drafter."""
    models = os.path.join(root, "srt", "models")
    kimi = _classes(os.path.join(models, "kimi_k25.py")).get(TARGET_CLASS)
    out = {"version": version_of(root), "target_class": kimi is not None,
           "eagle3_hook": bool(kimi and HOOK in kimi), "drafter_architecture": drafter_architecture,
           "drafter_class": None, "problems": []}
    v = out["version"] or "?"
    if kimi is None:
        out["problems"].append("SGLang %s has no %s (srt/models/kimi_k25.py; from 0.5.9)" % (v, TARGET_CLASS))
    elif drafter_architecture and HOOK not in kimi:
        out["problems"].append("SGLang %s: %s does not define %s (EAGLE-3; from 0.5.10): SGLang would refuse only "
                               "after the weight load" % (v, TARGET_CLASS, HOOK))
    if drafter_architecture:
        for path in sorted(glob.glob(os.path.join(models, "*.py"))):
            if drafter_architecture in _classes(path):
                out["drafter_class"] = "srt/models/" + os.path.basename(path)
                break
        else:
            out["problems"].append("SGLang %s has no model class %s (the drafter's config.json architectures[0])"
                                   % (v, drafter_architecture))
    return out
