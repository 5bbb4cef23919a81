"""vLLM 0.16.0 fully installed (cached venv): vLLM's own checks before and after the patch; vLLM 0.33.0's
own checks of the load settings."""
import json
import subprocess

import pytest

from deployer import engines
from deployer.engines.vllm_argv import build_serve_argv
from deployer.host.module_utils import eagle3_patch as pe
from deployer.sandbox.checkpoints import write_drafter_dir, write_model_dir
from helpers import CACHE, ROOT, need

pytestmark = pytest.mark.vllm
VENV = CACHE / "venvs" / "vllm-0.16.0"
VERIFIER = ROOT / "roles/verify/files/vllm_verify.py"


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    need((VENV / ".deployer-installed").exists(), "prepared vLLM 0.16.0 venv missing (scripts/dev.sh prepares it)")
    d = tmp_path_factory.mktemp("venv") / "vllm-0.16.0"
    # hard-link clone: the patch engine replaces files by rename, so the cache is never written through
    subprocess.run(["cp", "-al", str(VENV), str(d)], check=True)
    subprocess.run(["sed", "-i", f"s#{VENV}#{d}#g", str(d / "bin" / "python")], check=False)
    return d


@pytest.fixture(scope="module")
def clone_033(tmp_path_factory):
    v = CACHE / "venvs" / "vllm-0.33.0"
    need((v / ".deployer-installed").exists(), "prepared vLLM 0.33.0 venv missing (scripts/dev.sh prepares it)")
    return v     # native: nothing is patched, the prepared venv is used as it is


def prepare(tmp_path, platform="cpu", drafter_config=None, config_only=False, raw_extra=(), compute_caps=(),
            skip_config=False, launcher="vllm", **load):
    """The verifier's arguments for a rendered argv.  ``config_only``: the argv names a drafter directory that does
    not exist yet (its weights still being copied) and the verifier reads the drafter's config.json, shipped ahead,
    from another directory (``--drafter-dir``), as the verify role runs it beside the drafter copy."""
    write_model_dir(tmp_path / "model", shards=2)
    write_drafter_dir(tmp_path / "drafter")
    if drafter_config:
        (tmp_path / "drafter" / "config.json").write_text(json.dumps(drafter_config))
    extra = []
    if config_only:
        (tmp_path / "config-only").mkdir()
        (tmp_path / "drafter" / "config.json").rename(tmp_path / "config-only" / "config.json")
        (tmp_path / "drafter").rename(tmp_path / "drafter-weights-not-there-yet")
        extra = ["--drafter-dir", str(tmp_path / "config-only")]
    argv = build_serve_argv(dict(launcher=[launcher], model=str(tmp_path / "model"),
                                 served_model_name="kimi-k2.5", host="0.0.0.0", port=8000, tensor_parallel_size=8,
                                 trust_remote_code=True,
                                 gpu_memory_utilization=0.9, max_model_len=131072,
                                 speculative={"method": "eagle3", "model": str(tmp_path / "drafter"),
                                              "num_speculative_tokens": 3}, **load))
    argv += list(raw_extra)    # words the controller's own guard never saw (what the engine's parser must catch)
    n_extra = len(load.get("extra_args") or []) + len(raw_extra)
    extra += ["--extra-args", str(n_extra)] if n_extra else []
    extra += [f"--managed-dest={d}" for d in engines.get("vllm").managed_dests()]     # as the verify role passes
    extra += [f"--compute-cap={c}" for c in compute_caps] + (["--skip-config"] if skip_config else [])
    (tmp_path / "argv.json").write_text(json.dumps(argv))
    return ["--argv-json", str(tmp_path / "argv.json"), "--platform", platform, *extra]


def report_of(rc, stdout, stderr, platform):
    line = [x for x in stdout.splitlines() if x.startswith("DEPLOYER-VERIFY ")]
    assert line, stderr[-3000:]
    report = json.loads(line[-1][16:])
    # the report says which platform validated the launch: no GPU here, so CPU either way
    assert report["platform"] == ("cpu (forced)" if platform == "cpu" else "cpu (auto: no accelerator found)")
    return rc, {c["name"]: c for c in report["checks"]}


def verify(clone, tmp_path, platform="cpu", **kw):
    """vLLM's own checks on a rendered argv, in a process of their own, as the verify stage runs them."""
    r = subprocess.run([str(clone / "bin/python"), str(VERIFIER),
                        *prepare(tmp_path, platform, launcher=str(clone / "bin/vllm"), **kw)],
                       capture_output=True, text=True, timeout=600)
    return report_of(r.returncode, r.stdout, r.stderr, platform)


# Several verifier runs in one Python (the verifier's main() once per argv, each report read as the stage reads
# it): ~10-20 CPU-s of importing vLLM paid once instead of per case.  Only for cases after the first in a state of
# the venv: the verify stage itself always runs one process per launch (the first run here stays alone: a
# platform vLLM resolved once is kept for the process).
MANY = """import contextlib, io, json, sys
sys.path.insert(0, sys.argv[1])
import vllm_verify
out = []
for args in json.loads(sys.argv[2]):
    sys.argv = [vllm_verify.__file__] + args
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            rc = vllm_verify.main()
        except SystemExit as e:
            rc = e.code
    out.append([rc, buf.getvalue()])
sys.stdout.write("MANY " + json.dumps(out) + "\\n")
"""


def verify_many(clone, cases):
    """``cases``: (tmp_path, platform, kwargs) each; the (rc, checks) of each, in order."""
    args = [prepare(t, platform, launcher=str(clone / "bin/vllm"), **kw) for t, platform, kw in cases]
    r = subprocess.run([str(clone / "bin/python"), "-c", MANY, str(VERIFIER.parent), json.dumps(args)],
                       capture_output=True, text=True, timeout=900)
    line = [x for x in r.stdout.splitlines() if x.startswith("MANY ")]
    assert line, r.stderr[-3000:]
    return [report_of(rc, out, r.stderr, platform) for (rc, out), (_t, platform, _kw)
            in zip(json.loads(line[-1][5:]), cases, strict=True)]


def test_supports_eagle3_and_config_validation_before_and_after(clone, tmp_path):
    rc, checks = verify(clone, tmp_path / "before")
    assert rc == 1
    assert not checks["supports_eagle3"]["ok"]
    assert "'KimiK25ForConditionalGeneration': False" in checks["supports_eagle3"]["error"]
    assert "'DeepseekV2ForCausalLM': False" in checks["supports_eagle3"]["error"]
    assert checks["argument_parser"]["ok"]
    assert not checks["config_validation"]["ok"]
    assert "Eagle3 is only supported for" in checks["config_validation"]["error"]
    assert "deepseek_v3" in checks["config_validation"]["error"]

    root = pe.vllm_root_of(str(clone))
    assert pe.apply(root)["patches"] == ["P1", "P2", "P3", "P4", "P5"]
    from deployer.sandbox.checkpoints import drafter_config
    qwen = dict(drafter_config(), architectures=["Qwen2ForCausalLM"], model_type="qwen2")
    # the patched venv's cases, in one Python (verify_many; the verify stage runs one process per launch)
    after, sneaky, qwen_r, cfg_only, cfg_only_qwen = verify_many(clone, [
        # the load knobs the deployer exposes pass vLLM's own parser and config (deployer/serve.py)
        (tmp_path / "after", "auto", dict(compute_caps=["12.0"], safetensors_load_strategy="eager",
                                          model_loader_extra_config={"enable_multithread_load": True,
                                                                     "num_threads": 8},
                                          extra_args=["--max-num-batched-tokens", "4096"])),
        # guards (issue 20, item 3): vLLM's own parser on the extra words, whatever the spelling: an abbreviation
        # (--ho is --host), a dotted sub-key merged into the speculative config; refused before any restart
        (tmp_path / "sneaky", "cpu", dict(raw_extra=["--ho", "10.9.8.7",
                                                     "--speculative-config.num_speculative_tokens", "5"])),
        # a drafter of an architecture vLLM has no EAGLE-3 head for (a Qwen drafter shipped by mistake): vLLM's own
        # config validation refuses it before any restart (exit 4), instead of failing after the target's weights
        # loaded.  A name rule in the deployer would be wrong: EAGLE-3 checkpoints that say "LlamaForCausalLM" are
        # valid (vLLM prefixes "Eagle3"), which this run also confirmed on 0.16.0.
        (tmp_path / "qwen", "cpu", dict(drafter_config=qwen)),
        # the same two verdicts when only the drafter's config.json is on the host (the checks run while its
        # weights are copied): the config is what vLLM's validation reads, so the verdict cannot differ
        (tmp_path / "cfg-only", "cpu", dict(config_only=True)),
        (tmp_path / "cfg-only-qwen", "cpu", dict(config_only=True, drafter_config=qwen)),
    ])
    rc, checks = after
    assert rc == 0, checks
    assert "attention_backend" not in checks        # none named: the engine chooses on the GPU, nothing to ask
    assert checks["managed_flags"]["ok"]
    assert checks["managed_flags"]["detail"]["extra_args"] == ["--max-num-batched-tokens", "4096"]
    assert checks["supports_eagle3"]["detail"] == {"KimiK25ForConditionalGeneration": True,
                                                   "DeepseekV2ForCausalLM": True}
    assert checks["config_validation"]["detail"]["speculative_method"] == "eagle3"
    assert checks["config_validation"]["detail"]["text_model_type"] == "deepseek_v3"
    # 0.16.0 has no rule against this pair (0.24+ has: the 0.33.0 test below): its loader builds
    assert checks["model_loader"]["ok"] and checks["model_loader"]["detail"]["loader"] == "DefaultModelLoader"
    rc, checks = sneaky
    assert rc == 1 and not checks["managed_flags"]["ok"], checks
    assert "host, speculative_config" in checks["managed_flags"]["error"]
    rc, checks = qwen_r
    assert rc == 1 and not checks["config_validation"]["ok"]
    assert "Model architectures ['Eagle3Qwen2ForCausalLM'] are not supported" in checks["config_validation"]["error"]
    rc, checks = cfg_only
    assert rc == 0 and checks["config_validation"]["detail"]["speculative_method"] == "eagle3", checks
    rc, checks = cfg_only_qwen
    assert rc == 1 and "Eagle3Qwen2ForCausalLM" in checks["config_validation"]["error"]
    pe.revert(root)


FLASHMLA = dict(compute_caps=["9.0", "12.0"], skip_config=True, extra_args=["--attention-backend", "FLASHMLA"])
MT_PREFETCH = dict(safetensors_load_strategy="prefetch",
                   model_loader_extra_config={"enable_multithread_load": True, "num_threads": 8})


@pytest.fixture(scope="module")
def reports_033(clone_033, tmp_path_factory):
    """vLLM 0.33.0's verdicts on the two 0.33.0 cases below, from one Python (verify_many): {case: (rc, checks)}."""
    t = tmp_path_factory.mktemp("v033")
    flashmla, prefetch = verify_many(clone_033, [(t / "flashmla", "cpu", FLASHMLA), (t / "prefetch", "cpu",
                                                                                      MT_PREFETCH)])
    return {"flashmla": flashmla, "prefetch": prefetch}


@pytest.mark.parametrize("release", ["clone", "clone_033"])
def test_an_attention_backend_the_gpus_cannot_run_is_refused_by_the_installed_vllm_itself(release, request, tmp_path):
    """Issue 23, sm_120: vLLM checks a backend's compute capability only when it selects it on the GPU, after the
    restart.  The verifier asks the installed release's own backend class, for each capability preflight measured;
    the verdict is vLLM's (FlashMLA runs on Hopper, not on sm_120), not a list kept here."""
    if release == "clone":
        clone = request.getfixturevalue(release)
        (rc, checks), triton = verify_many(clone, [
            (tmp_path / "flashmla", "cpu", FLASHMLA),
            # the one MLA backend every release here runs on sm_120 (vllm/platforms/cuda.py's priorities for major 12)
            (tmp_path / "triton", "cpu", dict(compute_caps=["12.0"], skip_config=True,
                                              extra_args=["--attention-backend", "TRITON_MLA"]))])
        ab = triton[1]["attention_backend"]
        assert ab["ok"] and ab["detail"]["compute_caps"] == {"12.0": True}, triton
    else:
        rc, checks = request.getfixturevalue("reports_033")["flashmla"]
    # (rc and the other checks: the clone may be unpatched here; only the backend's verdict is this test's)
    err = checks["attention_backend"].get("error", "")
    assert not checks["attention_backend"]["ok"], checks
    assert "attention backend FLASHMLA does not run on compute capability 12.0, which" in err, err  # 9.0 not named
    assert "FlashMLABackend.supports_compute_capability" in err, err


def test_load_settings_the_installed_release_refuses_at_the_load_are_refused_by_its_own_loader_first(reports_033):
    """vLLM 0.24+ refuses the multi-thread loader with a --safetensors-load-strategy other than lazy when it builds
    its loader, at the start of the load (recorded on an H200 with 0.25.1: tests/fixtures/real-gpu/
    vllm-0.25.1-h200/mt_prefetch); the verify stage builds that loader from the rendered argv beforehand."""
    rc, checks = reports_033["prefetch"]
    assert rc == 1 and checks["config_validation"]["ok"] and not checks["model_loader"]["ok"], checks
    assert ("enable_multithread_load does not support safetensors_load_strategy='prefetch'"
            in checks["model_loader"]["error"]), checks["model_loader"]


PARSE_ONLY = """import json
from vllm import platforms
from vllm.platforms.cpu import CpuPlatform
platforms._current_platform = platforms.current_platform = CpuPlatform()   # no accelerator here (as vllm_verify)
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser(prog="vllm")
ServeSubcommand().subparser_init(parser.add_subparsers(required=True, dest="subparser"))
ns = parser.parse_args(["serve", "/m", "--disable-log-requests"])
print("PARSED", json.dumps({k: v for k, v in vars(ns).items() if "log_requests" in k}))
"""


@pytest.mark.parametrize("version", ["0.16.0", "0.18.0", "0.33.0"])
def test_the_matrix_says_what_each_parser_does_with_disable_log_requests(version):
    """docs/compatibility.md's --disable-log-requests column is read from each release's source
    (bench/compat_matrix.py); the installed release's own parser is the judge (0.33 accepts it though it declares
    no such flag: its parser pairs every --enable-x boolean with a --disable-x)."""
    v = CACHE / "venvs" / f"vllm-{version}"
    need((v / ".deployer-installed").exists(), f"prepared vLLM {version} venv missing (scripts/dev.sh prepares it)")
    row = next(r for r in json.loads((ROOT / "deployer/data/compatibility.json").read_text())["rows"]
               if r["engine"] == "vLLM" and r["version"] == version)
    r = subprocess.run([str(v / "bin/python"), "-c", PARSE_ONLY], capture_output=True, text=True, timeout=300)
    if row["disable_log_requests"] == "refused":
        assert r.returncode == 2 and "unrecognized arguments: --disable-log-requests" in r.stderr, r.stderr[-2000:]
    else:
        assert r.returncode == 0, r.stderr[-2000:]
        parsed = json.loads(r.stdout.split("PARSED ", 1)[1])
        key = "disable_log_requests" if row["disable_log_requests"] == "declared" else "enable_log_requests"
        assert parsed[key] is (key == "disable_log_requests"), parsed
