from deployer.ansible_plugins.module_utils.releases import plan_prune


def rel(i, t):
    return {"id": f"r{i}", "deployed_at": t}


def test_keeps_exactly_n_newest():
    rs = [rel(i, i) for i in range(10)]
    assert plan_prune(rs, 5, set()) == ["r0", "r1", "r2", "r3", "r4"]


def test_never_prunes_live_or_previous_even_if_old():
    rs = [rel(i, i) for i in range(10)]
    removed = plan_prune(rs, 5, {"r0", "r1"})
    assert "r0" not in removed and "r1" not in removed and len(rs) - len(removed) == 5


def test_keep_at_least_two():
    rs = [rel(i, i) for i in range(4)]
    assert plan_prune(rs, 0, set()) == ["r0", "r1"]


def test_never_deployed_releases_are_pruned_first():
    # live L, previous P, an old deployed O, a newer failed F that never served: keep=3 keeps O, prunes F
    rs = [{"id": "O", "deployed_at": 100}, {"id": "P", "deployed_at": 200}, {"id": "L", "deployed_at": 300},
          {"id": "F", "created_at": 400, "result": "failed"}]
    assert plan_prune(rs, 3, {"L", "P"}) == ["F"]
    # with room for all of them, nothing goes
    assert plan_prune(rs, 4, {"L", "P"}) == []


def test_flip_record_and_prune_on_a_real_directory(tmp_path):
    """module_utils/releases.py as release_flip uses it: links replaced atomically, the manifest recorded,
    releases pruned and the venvs/drafters no kept release names collected (interrupted removals too)."""
    import json
    import os

    from deployer.ansible_plugins.module_utils import releases as r
    root = tmp_path
    for i in range(4):
        d = root / "releases" / f"r{i}"
        d.mkdir(parents=True)
        (d / "release.json").write_text(json.dumps({"id": f"r{i}", "venv": str(root / "venvs" / f"v{i % 2}"),
                                                    "deployed_at": 100 + i}))
    for v in ("v0", "v1", "old", ".trash-x"):
        (root / "venvs" / v).mkdir(parents=True)
    assert r.relink(str(root / "current"), str(root / "releases/r2")) is True
    assert r.relink(str(root / "current"), str(root / "releases/r2")) is False      # already there
    assert os.readlink(root / "current") == str(root / "releases/r2")
    changed, _before, after = r.record(str(root / "releases/r2"), "live", {"load_seconds": 12.5})
    assert changed and after["result"] == "live" and after["load_seconds"] == 12.5
    assert r.record(str(root / "releases/r2"), "live", {"load_seconds": 12.5})[0] is False   # same outcome
    removed, kept, collected = r.prune(str(root / "releases"), 2, [str(root / "current")], str(root / "venvs"),
                                       None, [str(root / "venvs/v1")])
    assert removed == ["r0", "r1"] and kept == ["r2", "r3"]
    assert sorted(os.path.basename(c) for c in collected) == [".trash-x", "old"]
    assert sorted(os.listdir(root / "venvs")) == ["v0", "v1"]
