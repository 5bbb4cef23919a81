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
