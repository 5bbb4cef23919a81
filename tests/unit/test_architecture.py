"""The tree's floors (issue 43, docs/design.md "Layers"): every import in ``deployer/`` read from the source -
module level, inside functions, ``importlib.import_module("...")`` and a package that imports all its modules
through ``pkgutil`` - and held to three rules: no cycle; host code (what Ansible ships to the GPU host) imports only
host code and the standard library; the engines never import the plan that calls them."""
from __future__ import annotations

import ast

from helpers import ROOT

# modules and module_utils: shipped to the GPU host by Ansible, stdlib only (ansible.cfg: library, module_utils)
HOST = ("deployer.host.modules", "deployer.host.module_utils")
ANSIBLE_MU = "ansible.module_utils."
ANSIBLE_OWN = {"basic", "common", "six", "urls", "_text", "compat", "parsing"}   # ansible-core's own module_utils


def _modules() -> dict[str, object]:
    mods = {}
    for p in (ROOT / "deployer").rglob("*.py"):
        name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = p
    return mods


def _resolve(name: str, mods) -> str | None:
    if name.startswith(ANSIBLE_MU):              # how a module imports a module_util under Ansible
        rest = name[len(ANSIBLE_MU):]
        if rest.split(".")[0] in ANSIBLE_OWN:
            return None
        name = "deployer.host.module_utils." + rest
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for n in ast.walk(tree):
            cands = []
            if isinstance(n, ast.Import):
                cands = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    parts = pkg.split(".")[:len(pkg.split(".")) - (n.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                # a submodule by name, else a name defined in the module imported from
                cands = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in n.names]
            elif isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", None)) == "import_module":
                if n.args and isinstance(n.args[0], ast.Constant):
                    cands = [n.args[0].value]
                else:                              # a computed name: a package loading its own modules
                    cands = [m for m in mods if m.startswith(pkg + ".")]
            found.update(r for c in cands if (r := _resolve(c, mods)) and r != name and r.startswith("deployer"))
        graph[name] = found
    return graph


def cycles(graph) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_host_code_imports_only_host_code():
    up = [f"{a} -> {b}" for a, bs in import_graph().items() if a.startswith(HOST) for b in sorted(bs)
          if not b.startswith(HOST) and b not in ("deployer", "deployer.host")]
    assert up == []


def test_the_engines_never_import_the_plan():
    graph = import_graph()
    assert [f"{a} -> {b}" for a, bs in graph.items() if a.startswith("deployer.engines")
            for b in bs if b == "deployer.plan"] == []


def test_the_graph_sees_function_level_and_importlib_imports():
    # the analysis itself can fail: a module that imports the plan inside a function, and the engines' loader
    graph = import_graph()
    assert "deployer.plan" in graph["deployer.ansible_plugins.filter_plugins.deployer_filters"]
    assert "deployer.host.module_utils.host_probe" in graph["deployer.plan"]     # inside release_plan()
    assert {"deployer.engines.vllm", "deployer.engines.sglang"} <= graph["deployer.engines"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    # a module_util imported the way a module does it on the host counts as that module_util
    assert "deployer.host.module_utils.releases" in graph["deployer.host.modules.deployer_state"]
