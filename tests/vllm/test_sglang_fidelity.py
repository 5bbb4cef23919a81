"""The stand-in playing SGLang speaks the installed SGLang's own words, and the load parser follows it.

Runs against the real SGLang 0.5.23 venv scripts/dev.sh prepares (its source, its tqdm); docs/backends.md
lists the lines these tests keep honest.
"""
import json
import subprocess

import pytest

from deployer.host.module_utils import sglang_source
from deployer.host.module_utils.engine_logs import LoadState
from deployer.sandbox import sglang_standin
from deployer.sandbox.checkpoints import write_model_dir
from helpers import CACHE, ROOT, need

pytestmark = pytest.mark.vllm
VERSION = "0.5.23"


def venv():
    d = CACHE / "venvs" / f"sglang-{VERSION}"
    need((d / ".deployer-installed").exists(), f"prepared SGLang {VERSION} venv missing (scripts/dev.sh prepares it)")
    return d


def source():
    from deployer.sandbox import standin_base
    src = standin_base.EngineSource("sglang", sglang_standin.MESSAGES, sglang_standin.FALLBACK)
    src.root = str(venv() / "lib" / "python3.11" / "site-packages" / "sglang")
    return src


def test_every_sglang_line_is_found_in_the_installed_source():
    src = source()
    missing = [k for k in sglang_standin.MESSAGES if src.find(k)[2] == 0]
    assert not missing, f"SGLang {VERSION}: no source line for {missing} (update MESSAGES and docs/backends.md)"
    assert not src.find("bar_format")[0].endswith("\n")    # \r redraws only: journald sees the bar at its end
    assert src.find("eagle3")[0].startswith(" does not implement set_eagle3_layers_to_capture")


def test_the_standins_start_up_order_is_the_installed_sglangs():
    """scheduler.init_model_worker's calls, in the installed source's order: target weights, the drafter (its
    weights), the KV pools, the attention backends (the EAGLE-3 hook check), the CUDA graphs."""
    import ast
    src = (venv() / "lib" / "python3.11" / "site-packages" / "sglang" / "srt" / "managers" / "scheduler.py").read_text()
    fn = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef) and n.name == "init_model_worker")
    calls = [c.func.attr for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)]
    order = [c for c in calls if c in ("init_tp_model_worker", "maybe_init_draft_worker", "init_memory_pools",
                                       "init_all_attention_backends", "init_all_cuda_graphs")]
    assert order == ["init_tp_model_worker", "maybe_init_draft_worker", "init_memory_pools",
                     "init_all_attention_backends", "init_all_cuda_graphs"], calls
    # the hook check is in the attention backends' set-up; the decode interval the gauges wait for is 40
    runner = (venv() / "lib" / "python3.11" / "site-packages" / "sglang" / "srt" / "model_executor" /
              "model_runner.py").read_text()
    backends = runner[runner.index("def init_attention_backends"):][:600]
    assert "configure_aux_hidden_state_capture(" in backends
    obs = (venv() / "lib" / "python3.11" / "site-packages" / "sglang" / "srt" / "arg_groups" / "fields" /
           "observability.py").read_text()
    import re
    m = re.search(r"decode_log_interval: A\[.*?\] = (\d+)", obs, re.S)
    assert m and int(m.group(1)) == sglang_standin.DECODE_LOG_INTERVAL, "decode_log_interval's default moved"
    http = (venv() / "lib" / "python3.11" / "site-packages" / "sglang" / "srt" / "entrypoints" /
            "http_server.py").read_text()
    assert f'"SGLANG_HEALTH_CHECK_TIMEOUT", {sglang_standin.HEALTH_CHECK_TIMEOUT})' in http


def test_the_installed_sglang_can_serve_kimi_k25_with_both_drafters():
    root = sglang_source.sglang_root_of(str(venv()))
    for arch, where in (("LlamaForCausalLMEagle3", "srt/models/llama_eagle3.py"),
                        ("Eagle3DeepseekV2ForCausalLM", "srt/models/kimi_k25_eagle3.py")):
        c = sglang_source.capability(root, arch)
        assert c["problems"] == [] and c["version"] == VERSION and c["drafter_class"] == where, c


def test_parser_follows_the_sglang_standin(tmp_path):
    model = tmp_path / "model"
    write_model_dir(model, shards=8)
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    knobs = tmp_path / "knobs.json"
    knobs.write_text(json.dumps({"load_seconds": 1.5, "crash_phase": "api"}))   # die after a full load: exits
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DEPLOYER_STANDIN_KNOBS": str(knobs),
           "DEPLOYER_STANDIN_STATE": str(tmp_path / "state")}
    p = subprocess.run([str(venv() / "bin" / "python"), str(ROOT / "deployer/sandbox/vllm_standin.py"), "serve",
                        "--model-path", str(model), "--port", "18998", "--speculative-algorithm", "EAGLE3",
                        "--speculative-draft-model-path", str(drafter), "--tp-size", "8"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=120)
    text = p.stdout.decode()        # bytes: text mode would turn tqdm's \r into \n
    assert p.returncode == 1, text
    bar = [x for x in text.split("\n") if "Loading safetensors checkpoint shards:" in x and "/8 [" in x]
    assert len(bar) == 1 and bar[0].count("\r") >= 8, text     # one journal line, 8+ redraws inside it
    # every rank logs its loads and pools: 8 ranks x (target, drafter)
    assert text.count("] Load weight begin.") == 16 and "TP7] KV Cache is allocated" in text, text
    st, seen = LoadState("sglang"), []
    for i, line in enumerate(text.split("\n")):
        st.feed(line, float(i))
        if not seen or seen[-1] != st.phase:
            seen.append(st.phase)
    assert seen[1:5] == ["weights", "drafter", "kv_cache", "graphs"], seen   # then it dies (crash_phase api)
    assert st.facts["model_class"] == "KimiK25ForConditionalGeneration"
    assert st.facts["drafter_class"] == "LlamaForCausalLMEagle3" and st.facts["kv_cache_tokens"] > 0
    assert st.facts["kv_cache_gib"] > st.facts["drafter_kv_cache_gib"] > 0     # the target's pool is the KV cache
    assert st.facts["graphs_seconds"] > 0           # rank 0's, the target's bs=[...] end line included
    assert st.fatal and st.fatal[0] == "nccl", st.fatal
