"""The stand-in speaks each installed vLLM's own words, and the load parser understands every one of them.

Runs the stand-in with the real venvs' python (their real tqdm, their vLLM source) for vLLM 0.16.0, 0.18.0
and 0.33.0 (the newest, deployed in the sandbox by hand: docs/compatibility.md); docs/standin-fidelity.md is the
table these tests keep honest.
"""
import json
import subprocess
from pathlib import Path

import pytest

from deployer.host.module_utils.engine_logs import LoadState
from deployer.sandbox import vllm_standin_log as standin
from deployer.sandbox.checkpoints import write_model_dir
from helpers import CACHE, ROOT, need

pytestmark = pytest.mark.vllm
VERSIONS = ("0.16.0", "0.18.0", "0.33.0")


def venv(version):
    d = CACHE / "venvs" / f"vllm-{version}"
    need((d / ".deployer-installed").exists(), f"prepared vLLM {version} venv missing (scripts/dev.sh prepares it)")
    return d


def source(version):
    src = standin.VllmSource()
    src.root = str(venv(version) / "lib" / "python3.11" / "site-packages" / "vllm")
    return src


@pytest.mark.parametrize("version", VERSIONS)
def test_every_line_is_found_in_the_installed_source(version):
    src = source(version)
    missing = [k for k in standin.MESSAGES if src.find(k)[2] == 0]
    assert not set(missing) - set(standin.GONE) - set(standin.NOT_YET), \
        f"vLLM {version}: no source line for {missing} (update MESSAGES and the fidelity table)"
    if "kv_size" in missing:     # merged, never lost: the one line says both
        assert src.text("max_conc", "GPU", "418,016", "131,072", 3.19) == \
            "GPU KV cache size: 418,016 tokens, Maximum concurrency for 131,072 tokens per request: 3.19x"
    assert src.find("bar_format")[0].endswith("\n")     # every shard redraw is its own journal line
    # load_model's order: the drafter, the EAGLE-3 check, "Model loading took"; 0.33 moved the check into a helper
    # that load_model calls (_setup_eagle3_aux_hidden_state_outputs), so its call is where it happens
    runner = (Path(src.root) / "v1/worker/gpu_model_runner.py").read_text().splitlines()
    calls = [i + 1 for i, x in enumerate(runner) if x.strip() == "self._setup_eagle3_aux_hidden_state_outputs()"]
    eagle3_at = calls[0] if calls else src.find("eagle3")[2]
    assert src.find("drafter")[2] < eagle3_at < src.find("model_took")[2], (version, eagle3_at)


def test_wording_differs_by_version_as_the_source_says():
    old, new = source("0.16.0"), source("0.18.0")
    assert old.text("compile_total", 1.0) == "torch.compile takes 1.00 s in total"
    assert new.text("compile_total", 1.0) == "torch.compile took 1.00 s in total"
    assert old.text("api", 0, "http://0.0.0.0:8000") == "Starting vLLM API server 0 on http://0.0.0.0:8000"
    assert new.text("api", 0, "http://0.0.0.0:8000") == "Starting vLLM server on http://0.0.0.0:8000"
    # 0.33: compile lines lead with the backend's log prefix; the API server's line moved to another file; the
    # engine's init line carries the compile seconds; a dead worker's line its exit code
    newest = source("0.33.0")
    assert newest.text("compile_total", 1.0) == "[backbone] torch.compile took 1.00 s in total"
    assert newest.find("api")[:2] == ("Starting vLLM server on %s", "entry.py")
    assert newest.text("engine", 30.0, 3.0) == \
        "init engine (profile, create kv cache, warmup model) took 30.00 s (compilation: 3.00 s)"
    assert newest.text("worker_died", "VllmWorker-3", -9) == \
        "Worker proc VllmWorker-3 died unexpectedly (exit code: -9), shutting down executor."
    assert old.text("engine", 30.0, 3.0) == "init engine (profile, create kv cache, warmup model) took 30.00 seconds"


def run_standin(version, tmp_path, cache_root):
    model = tmp_path / "model"
    if not model.exists():
        write_model_dir(model, shards=8)
    knobs = tmp_path / "knobs.json"
    knobs.write_text(json.dumps({"load_seconds": 1.2, "crash_phase": "api"}))   # die after a full load: exits
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DEPLOYER_STANDIN_KNOBS": str(knobs),
           "DEPLOYER_STANDIN_STATE": str(tmp_path / "state"), "VLLM_CACHE_ROOT": str(cache_root)}
    # stdout and stderr into one pipe, as journald interleaves them
    p = subprocess.run([str(venv(version) / "bin" / "python"), str(ROOT / "deployer/sandbox/vllm_standin.py"), "serve",
                        str(model), "--port", "18999"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       env=env, timeout=120)
    return p.returncode, p.stdout.decode()   # bytes: text mode would turn tqdm's \r into \n


@pytest.mark.parametrize("version", VERSIONS)
def test_parser_follows_the_standin_of_each_version(version, tmp_path):
    cache = tmp_path / "vllm-cache"
    rc, text = run_standin(version, tmp_path, cache)
    assert rc == 1, text
    # vLLM's prefix writer puts "(Worker_TP0 pid=N) " before every redraw line of the shard bar
    redraws = [x for x in text.split("\n") if "Loading safetensors checkpoint shards:" in x and "/8 [" in x]
    assert len(redraws) >= 8 and all(x.startswith("(Worker_TP0 pid=") and ") \r" in x for x in redraws), text
    st, seen = LoadState(), []
    for i, line in enumerate(text.splitlines(keepends=True)):
        st.feed(line, float(i))
        if st.phase == "weights" and st.progress:
            seen.append(st.progress[0])
    assert len(set(seen)) >= 4, seen          # the shard bar moves, line by line
    assert st.facts["compile_cache"] == "miss" and "compile_seconds" in st.facts
    assert st.facts["kv_cache_tokens"] == 418016, st.facts      # 0.33: from the line that also ends the phase
    assert set(st.phase_durations(float(i))) >= {"weights", "compile", "kv_cache", "graphs", "api"}
    assert st.fatal and st.fatal[0] == "nccl", st.fatal   # the root cause, not "EngineCore failed to start."
    rc, text = run_standin(version, tmp_path, cache)      # same config, warm cache
    st = LoadState()
    st.feed(text, 0.0)
    assert st.facts["compile_cache"] == "hit", text


def test_model_runner_v2_only_source_is_spoken_and_parsed(tmp_path):
    """vLLM 0.34.0 has no V1 GPU runner (its pinned flashinfer-python is not on the index, so no venv here: the
    stand-in reads the wheel's own source, and the parser follows what it says): Model Runner V2's lines, in its
    order, the CUDA-graph bars named per mode, and the watcher records which runner ran."""
    import zipfile

    from vllm_wheels import wheel
    src_dir = tmp_path / "src"
    with zipfile.ZipFile(wheel("0.34.0")) as z:
        z.extractall(src_dir, [n for n in z.namelist() if n.startswith("vllm/") and n.endswith(".py")])
    src = standin.VllmSource()
    src.root = str(src_dir / "vllm")
    assert not src.has("start") and src.has("start_v2") and not src.has("drafter")
    missing = [k for k in standin.MESSAGES if src.find(k)[2] == 0]
    assert set(missing) <= set(standin.GONE), missing
    assert src.find("model_took_v2")[1:] == ("model_runner.py", src.find("model_took_v2")[2])
    model = tmp_path / "model"
    write_model_dir(model, shards=8)
    knobs = tmp_path / "knobs.json"
    knobs.write_text(json.dumps({"load_seconds": 1.2, "crash_phase": "api"}))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DEPLOYER_STANDIN_KNOBS": str(knobs),
           "DEPLOYER_STANDIN_STATE": str(tmp_path / "state"), "VLLM_CACHE_ROOT": str(tmp_path / "cache"),
           "PYTHONPATH": str(src_dir)}
    # a real venv's python for its tqdm (0.33.0's: the one closest to 0.34); PYTHONPATH puts 0.34.0's source first
    p = subprocess.run([str(venv("0.33.0") / "bin" / "python"), str(ROOT / "deployer/sandbox/vllm_standin.py"), "serve",
                        str(model), "--port", "18998"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                       timeout=120)
    text = p.stdout.decode()
    assert p.returncode == 1, text
    assert "[model_runner.py:" in text and "Loading model from scratch..." in text, text
    assert "Starting to load model" not in text and "Capturing CUDA graphs (FULL)" in text, text
    st = LoadState()
    for i, line in enumerate(text.splitlines(keepends=True)):
        st.feed(line, float(i))
    assert st.facts["model_runner"] == "v2" and "model_gib" in st.facts, st.facts
    assert set(st.phase_durations(float(i))) >= {"weights", "compile", "kv_cache", "graphs", "api"}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_name_the_verifier_imports_exists_in_each_version(version):
    """roles/verify/files/vllm_verify.py imports vLLM's own parser, validators and model classes; a name a release
    moved fails the deploy's verify stage on that release (0.29 moved validate_parsed_serve_args out of
    entrypoints/openai/cli_args.py: `[argument_parser] ModuleNotFoundError`).  Read from the source, no import."""
    from deployer.source_check import missing_imports
    site = Path(source(version).root).parent

    def read(rel):
        return (site / rel).read_text() if (site / rel).is_file() else None
    missing = missing_imports((ROOT / "roles/verify/files/vllm_verify.py").read_text(), "vllm", read)
    assert not missing, f"vLLM {version}: the verifier imports what this release does not have: {missing}"
