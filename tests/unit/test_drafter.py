"""Drafter manifests on the controller: content addressing, the hash cache, clear refusals."""
import json

import pytest

from deployer import drafter


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(drafter, "CACHE", tmp_path / "hashes.json")
    return tmp_path / "hashes.json"


def make(d, weights=b"w" * 100):
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"]}')
    (d / "model.safetensors").write_bytes(weights)
    (d / ".hidden").write_text("editor swap file")
    return d


def test_manifest_is_content_addressed(tmp_path):
    a = drafter.tree_manifest(str(make(tmp_path / "a")))
    b = drafter.tree_manifest(str(make(tmp_path / "b")))
    assert a["tree_sha256"] == b["tree_sha256"]                     # same content, other place: same id
    assert [f["path"] for f in a["files"]] == ["config.json", "model.safetensors"]   # dotfiles are not shipped
    assert a["bytes"] == sum(f["size"] for f in a["files"])
    c = drafter.tree_manifest(str(make(tmp_path / "c", weights=b"x" * 100)))
    assert c["tree_sha256"] != a["tree_sha256"]                     # one changed byte: another drafter


def test_hash_cache_keyed_by_size_and_mtime(tmp_path, cache):
    d = make(tmp_path / "d")
    first = drafter.tree_manifest(str(d))
    assert len(json.loads(cache.read_text())) == 2
    # a cached hash is used while (path, size, mtime) match: poison it and see it come back
    data = json.loads(cache.read_text())
    key = next(k for k in data if "model.safetensors" in k)
    data[key] = "0" * 64
    cache.write_text(json.dumps(data))
    assert drafter.tree_manifest(str(d))["tree_sha256"] != first["tree_sha256"]
    (d / "model.safetensors").write_bytes(b"w" * 101)               # size changes: re-hashed
    again = drafter.tree_manifest(str(d))
    assert "0" * 64 not in [f["sha256"] for f in again["files"]]


def test_refusals_say_what_is_wrong(tmp_path):
    with pytest.raises(drafter.DrafterError, match="empty"):
        drafter.tree_manifest("")
    (tmp_path / "nocfg").mkdir()
    with pytest.raises(drafter.DrafterError, match="config.json not found"):
        drafter.tree_manifest(str(tmp_path / "nocfg"))


def test_a_concurrent_deploys_cache_entries_survive(tmp_path, cache, monkeypatch):
    """Issue 24 item 7: deploys on one controller (a fleet's parallel runs, the test suite's workers) share the hash
    cache.  Each used to write back the whole cache it had read before hashing, so an entry another run wrote in
    the meantime was lost (and an entry poisoned on purpose by a test was undone).  Only this run's new hashes are
    merged, under a lock, into the file as it is when written."""
    cache.write_text(json.dumps({"/elsewhere|1|1": "a" * 64}))
    real = drafter._file_sha256

    def hash_while_another_run_writes(path):
        data = json.loads(cache.read_text())
        data["/other-run|2|2"] = "b" * 64             # another deploy finished hashing meanwhile
        data["/elsewhere|1|1"] = "c" * 64             # and changed an entry (a test poisoning it)
        cache.write_text(json.dumps(data))
        return real(path)

    monkeypatch.setattr(drafter, "_file_sha256", hash_while_another_run_writes)
    m = drafter.tree_manifest(str(make(tmp_path / "d")))
    data = json.loads(cache.read_text())
    assert data["/other-run|2|2"] == "b" * 64 and data["/elsewhere|1|1"] == "c" * 64, data
    assert all(f["sha256"] in data.values() for f in m["files"])
