"""deployer/drafter_fit.py: a drafter that does not fit its target is refused before the load, as the INSTALLED
engine would wire it (issue 21).  The tiny models are the real-GPU run's (docs/real-engine.md: 6 layers, hidden
1024, the drafter's fc 3 x 1024); the sandbox's is AQ-MedAI/Kimi-K25-eagle3's shape on Kimi-K2.5 (61 layers)."""
import pytest

from deployer import drafter_fit as fit
from deployer.sandbox.checkpoints import drafter_config, drafter_tensors, kimi_config

TINY_TARGET = {"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 6, "hidden_size": 1024,
               "vocab_size": 4096}
TINY_DRAFTER = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 1024, "num_hidden_layers": 1,
                "vocab_size": 4096, "draft_vocab_size": 1024}
TINY_SHAPES = {"fc.weight": [1024, 3072], "d2t": [1024], "t2d": [4096], "lm_head.weight": [1024, 1024]}


def test_the_recorded_bad_drafter_is_refused_with_the_numbers():
    # guards: the H200 run's bad_drafter (no layer ids: vLLM used the target's default (2, 3, 3), 2 distinct layers,
    # 2048 inputs for an fc of 3072) passed every check and /health, then died on the first request
    r = fit.check(TINY_TARGET, TINY_DRAFTER, TINY_SHAPES, "vllm", "0.20.0")
    assert r["captured"] == [2, 3] and r["fc_in"] == 3072 and r["expected_fc_in"] == 2048
    msg = r["refusals"][0]
    assert "fc.weight takes 3072 inputs" in msg and "target layers [2, 3]" in msg and "hidden size 1024" in msg
    assert "expected 2 x 1024 = 2048" in msg and "vLLM 0.20.0" in msg
    assert any("name 1 layer(s) twice" in w for w in r["warnings"])


def test_the_recorded_good_drafter_fits_vllm_but_not_sglang():
    # the fix that made the good runs: top-level ids [1, 3, 4]; vLLM reads them, SGLang reads only eagle_config's
    good = dict(TINY_DRAFTER, eagle_aux_hidden_state_layer_ids=[1, 3, 4])
    assert fit.check(TINY_TARGET, good, TINY_SHAPES, "vllm", "0.20.0")["refusals"] == []
    sg = fit.check(TINY_TARGET, good, TINY_SHAPES, "sglang", "0.5.23")
    assert sg["captured"] == [2, 3] and "SGLang 0.5.23" in sg["refusals"][0]
    assert any("where SGLang 0.5.23 does not read them" in w for w in sg["warnings"])
    nested = dict(TINY_DRAFTER, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 3]})
    sg = fit.check(TINY_TARGET, nested, TINY_SHAPES, "sglang", "0.5.23")
    assert sg["captured"] == [2, 3, 4] and sg["refusals"] == [] and "+1" in sg["source"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_sandbox_drafter_fits_kimi_k2_5_on_both_engines(engine):
    shapes = {k: v[1] for k, v in drafter_tensors().items()}
    r = fit.check(kimi_config(), drafter_config(), shapes, engine, "x")
    assert r["refusals"] == [] and r["captured"] == [2, 30, 58] and r["fc_in"] == 3 * 7168


@pytest.mark.parametrize("change,said", [
    ({"eagle_aux_hidden_state_layer_ids": [2, 30, 61]}, "aux layers [61]"),
    ({"target_hidden_size": 4096}, "target_hidden_size 4096, the target's hidden size is 7168"),
    ({"vocab_size": 32000}, "vocab_size 32000, the target's is 163840"),
])
def test_config_mismatches_are_refused(change, said):
    shapes = {k: v[1] for k, v in drafter_tensors().items()}
    r = fit.check(kimi_config(), dict(drafter_config(), **change), shapes, "vllm", "0.16.0")
    assert any(said in x for x in r["refusals"]), r


def test_vocabulary_tensors_and_ignored_flags():
    shapes = {k: v[1] for k, v in drafter_tensors().items()}
    r = fit.check(kimi_config(), drafter_config(), dict(shapes, d2t=[16000]), "vllm", "0.16.0")
    assert any("d2t has shape [16000], expected [draft_vocab_size] = [32000]" in x for x in r["refusals"])
    r = fit.check(kimi_config(), dict(drafter_config(), fc_norm=True), shapes, "vllm", "0.16.0")
    assert r["refusals"] == [] and any("fc_norm is set" in w for w in r["warnings"])


def test_the_header_is_read_from_a_real_safetensors_file(tmp_path):
    from deployer.sandbox.checkpoints import write_drafter_dir
    write_drafter_dir(tmp_path / "d", fc_in=2 * 7168)
    cfg, shapes = fit.read_drafter(str(tmp_path / "d"))
    assert shapes["fc.weight"] == [7168, 14336] and cfg["draft_vocab_size"] == 32000
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "config.json").write_text("{}")
    (tmp_path / "e" / "model.safetensors").write_bytes(b"\x01")
    with pytest.raises(fit.DrafterFitError, match="not a safetensors file"):
        fit.read_drafter(str(tmp_path / "e"))


def test_the_rules_follow_the_installed_release():
    # measured on each release's source (bench/compat_matrix.py): vLLM < 0.22 reads only top-level ids and builds
    # fc for 3 x hidden; from 0.22 it falls back to eagle_config's ids and sizes fc by their count
    two = dict(TINY_DRAFTER, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 4]})
    shapes = dict(TINY_SHAPES, **{"fc.weight": [1024, 2048]})
    new = fit.check(TINY_TARGET, two, shapes, "vllm", "0.33.0")
    assert new["refusals"] == [] and new["captured"] == [1, 4] and "eagle_config" in new["source"]
    old = fit.check(TINY_TARGET, two, shapes, "vllm", "0.20.2")
    assert old["captured"] == [2, 3] and any("builds the drafter's fc for 3072 inputs" in x for x in old["refusals"])
    assert any("does not read them" in w for w in old["warnings"])
    # the sandbox's drafter (AQ-MedAI's shape: nested [2, 30, 58]) fits Kimi-K2.5 on every release
    sbx = {k: v[1] for k, v in drafter_tensors().items()}
    for v in ("0.16.0", "0.20.2", "0.22.1", "0.33.0"):
        assert fit.check(kimi_config(), drafter_config(), sbx, "vllm", v)["refusals"] == [], v


def test_a_kimi_config_without_the_field_vllm_s_eagle_proposer_reads_is_refused():
    """vLLM's EAGLE proposer reads media_placeholder_token_id from a KimiK25 target when it loads the drafter,
    after the target's weights (issue 41: a config in transformers 5.x's schema names it image_token_id only, and the
    real vLLM 0.32 died at load).  0.34's Model Runner V2 reads none."""
    shapes = {k: v[1] for k, v in drafter_tensors().items()}
    kimi = kimi_config()          # the sandbox's: the hub's schema
    assert kimi["architectures"] == ["KimiK25ForConditionalGeneration"] and kimi["media_placeholder_token_id"]
    for version in ("0.16.0", "0.18.0", "0.33.0", "0.34.0"):
        assert fit.check(kimi, drafter_config(), shapes, "vllm", version)["refusals"] == [], version
    schema5 = {k: v for k, v in kimi.items() if k != "media_placeholder_token_id"} | {
        "image_token_id": kimi["media_placeholder_token_id"]}
    for version in ("0.16.0", "0.18.0", "0.33.0"):
        r = fit.check(schema5, drafter_config(), shapes, "vllm", version)
        assert any("no media_placeholder_token_id" in x and f"= {kimi['media_placeholder_token_id']}?" in x
                   and f"vLLM {version}" in x
                   for x in r["refusals"]), r["refusals"]
    assert fit.check(schema5, drafter_config(), shapes, "vllm", "0.34.0")["refusals"] == []
    bare = dict(kimi["text_config"], architectures=["DeepseekV3ForCausalLM"])       # a bare DeepSeek-V3 target
    assert fit.check(bare, drafter_config(), shapes, "vllm", "0.33.0")["refusals"] == []


def test_a_full_vocabulary_drafter_that_ships_d2t_is_refused_where_vllm_refuses_it():
    """vLLM >= 0.30 builds no draft_id_to_target_id when the drafter's vocabulary is the target's, and a checkpoint
    that ships d2t then fails at load (issue 41: the real vLLM 0.32 on a CPU, after the target's weights).  0.20 loaded
    the same drafter (the H200 recordings)."""
    full = dict(TINY_DRAFTER, draft_vocab_size=4096, eagle_aux_hidden_state_layer_ids=[1, 3, 4])
    shapes = dict(TINY_SHAPES, d2t=[4096], **{"lm_head.weight": [4096, 1024]})
    for version in ("0.20.0", "0.29.0"):
        assert fit.check(TINY_TARGET, full, shapes, "vllm", version)["refusals"] == [], version
    for version in ("0.30.0", "0.32.0", "0.33.0"):
        r = fit.check(TINY_TARGET, full, shapes, "vllm", version)["refusals"]
        assert any("ships d2t although its draft_vocab_size 4096" in x and f"vLLM {version}" in x for x in r), r
    no_map = {k: v for k, v in shapes.items() if k not in ("d2t", "t2d")}
    assert fit.check(TINY_TARGET, full, no_map, "vllm", "0.33.0")["refusals"] == []
    small = dict(TINY_DRAFTER, eagle_aux_hidden_state_layer_ids=[1, 3, 4])          # draft vocab 1024 < 4096
    assert fit.check(TINY_TARGET, small, TINY_SHAPES, "vllm", "0.33.0")["refusals"] == []
