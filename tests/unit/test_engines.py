"""deployer/engines: one seam per engine (issue 22).  No role, playbook, template or module outside the engines'
own modules compares engine names; a third engine registered here renders a plan, an argv, a unit and a log-rule
set without any role changing."""
import re

import pytest
from test_plan import DRAFTER
from test_render_golden import settings

from deployer import engines
from deployer.ansible_plugins.module_utils.engine_logs import RULESETS, LoadState
from deployer.plan import make_plan
from helpers import ROOT

# files that ARE an engine's own (its argv builder, patch engine, source probe, verifier, stand-in)
ENGINE_OWN = {"deployer/serve.py", "deployer/serve_sglang.py", "deployer/ansible_plugins/module_utils/eagle3_patch.py",
              "deployer/ansible_plugins/module_utils/sglang_source.py", "roles/verify/files/vllm_verify.py",
              "roles/verify/files/sglang_verify.py"}
COMPARE = re.compile(r"""(?:==|!=)\s*['"](?:vllm|sglang)['"]|['"](?:vllm|sglang)['"]\s*(?:==|!=)|"""
                     r"""['"](?:vllm|sglang)['"]\s+if\b|"""
                     r"""\bin\s*[(\[{][^)\]}]*['"](?:vllm|sglang)['"]""")   # membership in a literal list of names


def test_no_engine_name_is_compared_outside_the_engines():
    found = []
    for base in ("deployer", "roles", "playbooks", "templates"):
        for f in (ROOT / base).rglob("*"):
            rel = str(f.relative_to(ROOT))
            if not f.is_file() or f.suffix not in (".py", ".yml", ".j2") or rel in ENGINE_OWN \
                    or rel.startswith(("deployer/engines/", "deployer/sandbox/")):
                continue
            for n, line in enumerate(f.read_text().splitlines(), 1):
                if COMPARE.search(line):
                    found.append(f"{rel}:{n}: {line.strip()}")
    assert found == [], "\n".join(found)


@pytest.fixture
def toy():
    @engines.register
    class Toy(engines.Engine):
        name, label, package, program = "toy", "Toy", "toy-serve", "toy"
        version_setting, extra_args_setting = "toy_version", "toy_extra_args"
        verifier, log_rules, drafts_metric = "toy_verify.py", "vllm", "toy:drafts_total"

        def version(self, s):
            return str(s["toy_version"])

        def argv(self, s, venv, drafter, credentials):
            return [f"{venv}/bin/toy", "serve", s["model_dir"], "--port", str(s["port"])] + list(s.get("toy_extra_args")
                                                                                           or [])

        def env(self, s, server_cache):
            return {"TOY_CACHE": f"{server_cache}/toy"}
    yield engines.get("toy")
    engines.REGISTRY.pop("toy")


def test_a_third_engine_renders_a_plan_an_argv_a_unit_and_log_rules_without_touching_a_role(toy, tmp_path):
    p = make_plan(settings(backend="toy", toy_version="1.2.3", toy_extra_args=["--fast"]), DRAFTER)
    assert p["engine"]["name"] == "toy" and p["engine"]["verifier"] == "toy_verify.py"
    assert p["venv"] == "/opt/deployer/venvs/toy-1.2.3" and p["vllm_version"] is None
    assert p["argv"] == ["/opt/deployer/venvs/toy-1.2.3/bin/toy", "serve", "/srv/models/Kimi-K2.5", "--port", "8000",
                         "--fast"]
    assert p["env"]["TOY_CACHE"] == "/opt/deployer/cache/server/toy" and p["extra_args_count"] == 1
    # the render role's own templates, through Ansible
    from test_render_golden import render_plan
    unit, env = render_plan(tmp_path, p)
    assert 'ExecStart="/opt/deployer/venvs/toy-1.2.3/bin/python" "-I" "-S"' in unit and '"--fast"' in unit
    assert 'TOY_CACHE="/opt/deployer/cache/server/toy"' in env
    st = LoadState(p["engine"]["log_rules"])
    assert st.rules is RULESETS["vllm"]
    with pytest.raises(Exception, match=r"backend: got 'nope', expected one of \['sglang', 'toy', 'vllm'\]"):
        make_plan(settings(backend="nope"), DRAFTER)


def test_which_engine_a_unit_starts():
    assert engines.engine_of_unit('ExecStart="/v/bin/sglang" "serve" "--model-path" "/m"') == "sglang"
    assert engines.engine_of_unit('ExecStart="/v/bin/vllm" "serve" "/m"') == "vllm"
    assert engines.describe("sglang")["drafts_metric"] == "sglang:spec_verify_calls_total"
