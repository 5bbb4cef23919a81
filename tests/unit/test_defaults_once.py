"""Each default written once (issue 43, docs/design.md "Every setting documented once"): a setting's default lives in
its role's ``defaults/main.yml`` and nowhere else.  The generated settings always carry every key, so a second copy
(``s.get("num_speculative_tokens", 3)``, ``deployer_port | default(8000)``) can never fire: it can only drift.  This
reads the code for a literal equal to a setting's default beside that setting's name."""
from __future__ import annotations

import ast
import re

import yaml

from helpers import ROOT

GENERATED = {"roles/deployer/vars/main/settings.yml"}      # scripts/gen_argument_specs.py writes it from the defaults


def _defaults() -> dict[str, object]:
    """Every role's variables with their defaults; the deployer role's also without the ``deployer_`` prefix (what
    the plan's settings call them)."""
    out = {}
    for f in sorted(ROOT.glob("roles/*/defaults/main.yml")):
        for k, v in (yaml.safe_load(f.read_text()) or {}).items():
            out[k] = v
            if k.startswith("deployer_"):
                out[k[len("deployer_"):]] = v
    return out


def _literal(node):
    return node.value if isinstance(node, ast.Constant) else ...


def _sources():
    for p in sorted((ROOT / "deployer").rglob("*.py")):
        if "sandbox" not in p.parts:        # the simulated host's own knobs are not settings
            yield str(p.relative_to(ROOT)), p.read_text()


def python_copies(defaults, sources=None) -> list[str]:
    hits = []
    for rel, text in sources if sources is not None else _sources():
        for n in ast.walk(ast.parse(text)):
            key = default = ...
            if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "get" and len(n.args) == 2:
                key, default = _literal(n.args[0]), _literal(n.args[1])           # x.get("key", literal)
            elif isinstance(n, ast.BoolOp) and isinstance(n.op, ast.Or) and len(n.values) == 2:
                a, b = n.values                                                     # x.get("key") or literal
                if isinstance(a, ast.Call) and getattr(a.func, "attr", "") == "get" and len(a.args) == 1:
                    key, default = _literal(a.args[0]), _literal(b)
            if isinstance(key, str) and key in defaults and default is not ... \
                    and default not in (None, "", 0, False) and default == defaults[key]:
                hits.append(f"{rel}:{n.lineno}: {key} with its default {default!r}")
    return hits


JINJA_DEFAULT = re.compile(r"\b([a-z][a-z0-9_]*)\s*\|\s*default\(\s*([^(),]+?)\s*\)")
JINJA_ATTR_DEFAULT = re.compile(r"attribute=['\"]([a-z0-9_]+)['\"],\s*default=([^()]+?)\)")


def yaml_copies(defaults) -> list[str]:
    hits = []
    for base in ("roles", "playbooks", "templates"):
        for p in sorted((ROOT / base).rglob("*")):
            rel = str(p.relative_to(ROOT))
            if p.suffix not in (".yml", ".j2") or rel in GENERATED or p.name == "argument_specs.yml" \
                    or rel.endswith("/defaults/main.yml"):
                continue
            for i, line in enumerate(p.read_text().splitlines(), 1):
                for rx in (JINJA_DEFAULT, JINJA_ATTR_DEFAULT):
                    for name, raw in rx.findall(line):
                        if name not in defaults or defaults[name] in (None, "", [], {}):
                            continue
                        try:
                            value = yaml.safe_load(raw)
                        except yaml.YAMLError:
                            continue
                        if value == defaults[name] and value is not False:
                            hits.append(f"{rel}:{i}: {name} | default({raw})")
                        elif value is False and defaults[name] is False:
                            hits.append(f"{rel}:{i}: {name} | default({raw})")
    return hits


def test_no_setting_default_is_written_twice():
    defaults = _defaults()
    assert python_copies(defaults) + yaml_copies(defaults) == []


def test_the_reader_finds_a_second_copy():
    # the check itself can fail: copies as the code wrote them before issue 43
    d = {"num_speculative_tokens": 3, "port": 8000, "host": "0.0.0.0"}
    code = 'a = s.get("num_speculative_tokens", 3)\nb = spec.get("host") or "0.0.0.0"\nc = s.get("port", 1)\n'
    assert python_copies(d, [("x.py", code)]) == ["x.py:1: num_speculative_tokens with its default 3",
                                                  "x.py:2: host with its default '0.0.0.0'"]
    assert JINJA_DEFAULT.findall("{{ hostvars[h].deployer_port | default(8000) | int }}") == \
        [("deployer_port", "8000")]
    assert JINJA_ATTR_DEFAULT.findall("map(attribute='deployer_backend', default='vllm')") == \
        [("deployer_backend", "'vllm'")]
