"""Does an engine release still have what a script of ours imports from it?  Read from the release's source
(an installed venv or its wheel), never imported: the engines' checks (roles/verify/files/*_verify.py) import the
engine's own parser, validators and model classes, and a release that moved one fails the deploy's verify stage on
it (vLLM 0.29 moved ``validate_parsed_serve_args``: the verify stage failed on 0.29-0.33).  Pure: ``read(relpath)``
supplies the text."""
from __future__ import annotations

import ast
from typing import Callable, Optional


def _top_level_names(text: str) -> set:
    """Names a module defines or imports anywhere in its body (what ``from it import name`` can find)."""
    names = set()
    for n in ast.walk(ast.parse(text)):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names |= {a.asname or a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.Assign):
            names |= {t.id for t in n.targets if isinstance(t, ast.Name)}
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            names.add(n.target.id)
    return names


def missing_imports(script: str, package: str, read: Callable[[str], Optional[str]]) -> list[str]:
    """``module.name`` (or ``module``) for every ``from <package>.x import name`` in ``script`` that the release
    lacks; ``read`` gets paths like ``vllm/entrypoints/cli/serve.py`` and returns None for a missing file."""
    out = []
    for node in ast.walk(ast.parse(script)):
        if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package + ".")):
            continue
        base = node.module.replace(".", "/")
        text = read(base + ".py")
        if text is None:
            text = read(base + "/__init__.py")
        if text is None:
            out.append(node.module)
            continue
        names = _top_level_names(text)
        out += [f"{node.module}.{a.name}" for a in node.names if a.name not in names]
    return sorted(set(out))
