from deployer.host.module_utils.releases import plan_prune


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

    from deployer.host.module_utils import releases as r
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


def test_release_files_edited_after_render_and_drafter_files_changed_after_shipping(tmp_path):
    """Guards the tamper checks of the no-op probe and the rollback (module_utils/releases.py)."""
    import hashlib
    import json
    import os

    from deployer.host.module_utils.releases import drafter_changed, edited_files
    rel = tmp_path / "rel"
    rel.mkdir()
    for name, text in (("argv.json", '["vllm", "serve"]\n'), ("vllm.env", "A=1\n"), ("x.service", "[Unit]\n")):
        (rel / name).write_text(text)
    (rel / ".deployer-sha256sums").write_text("".join(
        f"{hashlib.sha256((rel / n).read_bytes()).hexdigest()}  {n}\n" for n in ("argv.json", "vllm.env", "x.service")))
    assert edited_files(str(rel)) == []
    (rel / "argv.json").write_text('["vllm", "serve", "--evil"]\n')
    (rel / "x.service").unlink()
    assert edited_files(str(rel)) == ["argv.json", "x.service"]
    assert edited_files(str(tmp_path)) == []          # a release from before the record: nothing to compare

    d = tmp_path / "drafter"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"w" * 100)
    (d / ".deployer-complete").write_text(json.dumps({"files": [{"path": "config.json", "size": 2},
                                                                 {"path": "model.safetensors", "size": 100}]}))
    done = os.stat(d / ".deployer-complete").st_mtime_ns
    for f in ("config.json", "model.safetensors"):
        os.utime(d / f, ns=(done - 10**9, done - 10**9))
    assert drafter_changed(str(d)) == []
    os.utime(d / "model.safetensors", ns=(done + 10**9, done + 10**9))     # rewritten in place after shipping
    assert drafter_changed(str(d)) == ["model.safetensors (modified after it was shipped)"]
    (d / "model.safetensors").write_bytes(b"w" * 50)
    (d / "config.json").unlink()
    assert drafter_changed(str(d)) == ["config.json (missing)", "model.safetensors (50 bytes, shipped 100)"]
    assert drafter_changed(str(tmp_path / "none")) == [] and drafter_changed("") == []
