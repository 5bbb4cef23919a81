"""The verifier's engine cache (roles/verify/files/vllm_verify.py): vLLM's model-registry answers carried from one
run of the checks to the next, through a root-owned file, into the checks' private /tmp."""
import importlib.util
import json

from helpers import ROOT


def verifier():
    spec = importlib.util.spec_from_file_location("vllm_verify", ROOT / "roles/verify/files/vllm_verify.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_entries_land_where_vllm_looks_and_nothing_else_is_written(tmp_path, monkeypatch):
    v = verifier()
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    good = "vllm-model_executor-models-kimi_k25-KimiK25ForConditionalGeneration.json"
    info = {"hash": "ab" * 32, "modelinfo": {"supports_eagle3": True}}
    cache = tmp_path / "engine-cache.json"
    # a name with a path in it, or an entry that is not an object, is never written
    cache.write_text(json.dumps({"modelinfos": {good: info, "../../escape.json": info, "x.json": "not a dict",
                                                "no-suffix": info}}))
    assert v.seed_modelinfos(str(cache)) == {good: info}
    assert sorted(p.name for p in (tmp_path / "vllm" / "modelinfos").iterdir()) == [good]
    assert not (tmp_path / "escape.json").exists()
    assert v.modelinfos_now() == {good: info}


def test_a_missing_or_broken_cache_seeds_nothing(tmp_path, monkeypatch):
    v = verifier()
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    assert v.seed_modelinfos(str(tmp_path / "none.json")) == {}
    (tmp_path / "broken.json").write_text("{not json")
    assert v.seed_modelinfos(str(tmp_path / "broken.json")) == {}
    (tmp_path / "list.json").write_text("[]")
    assert v.seed_modelinfos(str(tmp_path / "list.json")) == {}
    assert v.modelinfos_now() == {}


def test_the_default_cache_root_is_vllms_own(tmp_path, monkeypatch):
    # vllm/envs.py: VLLM_CACHE_ROOT, else $XDG_CACHE_HOME/vllm, else ~/.cache/vllm
    v = verifier()
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert v.modelinfo_dir() == str(tmp_path / "xdg" / "vllm" / "modelinfos")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert v.modelinfo_dir() == str(tmp_path / "home" / ".cache" / "vllm" / "modelinfos")
