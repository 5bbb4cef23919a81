"""deployer/plan.py: the checks that refuse a deploy before anything changes, and what the plan decides
for the service (user, caches, venv per patch engine).  Each test names what it guards."""
import pytest
from test_render_golden import settings

from deployer import plan as planmod
from deployer.plan import PlanError, make_plan

DRAFTER = {"src": "/d", "files": [], "tree_sha256": "ab" * 32, "bytes": 0}


def test_open_api_is_refused_and_names_the_way_out():
    # guards: binding the network with no API key never deploys silently
    with pytest.raises(PlanError) as e:
        make_plan(settings(allow_unauthenticated=False, host="0.0.0.0", api_key=""), DRAFTER)
    msg = str(e.value)
    assert "'0.0.0.0'" in msg and "deployer_api_key" in msg and "deployer_allow_unauthenticated" in msg


@pytest.mark.parametrize("host,key,allow,protected", [
    ("127.0.0.1", "", False, True), ("::1", "", False, True), ("localhost", "", False, True),
    ("0.0.0.0", "k", False, True), ("10.1.2.3", "", True, False)])
def test_api_protection_is_recorded(host, key, allow, protected):
    p = make_plan(settings(allow_unauthenticated=allow, host=host, api_key=key), DRAFTER)
    assert p["api_protected"] is protected


@pytest.mark.parametrize("user", ["root", "Bad User", "x" * 40, ""])
def test_service_user_root_or_malformed_refused(user):
    # guards: the server never runs as root ("" falls back to the default, which is fine)
    if user == "":
        assert make_plan(settings(service_user=user), DRAFTER)["user"] == "vllm"
        return
    with pytest.raises(PlanError, match="service_user"):
        make_plan(settings(service_user=user), DRAFTER)


def test_caches_live_in_the_service_users_home_and_are_the_only_writable_path():
    p = make_plan(settings(writable_paths=["-/run/x"]), DRAFTER)
    sc = "/opt/deployer/cache/server"
    assert p["dirs"]["server_cache"] == sc
    assert {p["env"][k] for k in ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "HF_HOME", "XDG_CACHE_HOME")} == {
        f"{sc}/vllm", f"{sc}/triton", f"{sc}/huggingface", f"{sc}/xdg"}
    assert p["unit"]["writable_paths"] == [sc, "-/run/x"]


@pytest.mark.parametrize("field,value", [("writable_paths", ["relative/x"]), ("writable_paths", ["/a b"]),
                                         ("writable_paths", ["/opt/../etc"]), ("device_allow", ["/etc/passwd rw"]),
                                         ("device_allow", ["char-nvidia rw; rm"]), ("root", "/opt/my deploy"),
                                         ("root", "/opt/%n")])
def test_unit_paths_with_metacharacters_refused(field, value):
    # guards: nothing reaches the unit file that systemd would split or expand
    with pytest.raises(PlanError, match=field):
        make_plan(settings(**{field: value}), DRAFTER)


def test_patched_venv_is_named_by_the_patch_engine(monkeypatch):
    # guards: a changed patch engine gets a new venv; the live release's venv is never re-patched
    a = make_plan(settings(patch_engine_id=None), DRAFTER)
    assert a["venv"] == f"/opt/deployer/venvs/vllm-0.16.0-p{planmod.patch_engine_id()}"
    monkeypatch.setattr(planmod, "patch_engine_id", lambda: "deadbeef")
    b = make_plan(settings(patch_engine_id=None), DRAFTER)
    assert b["venv"].endswith("-pdeadbeef") and b["venv"] != a["venv"]
    assert planmod.release_id(a, "fp") != planmod.release_id(b, "fp")     # argv names the venv
    assert make_plan(settings(patch_enabled=False), DRAFTER)["venv"] == "/opt/deployer/venvs/vllm-0.16.0"


def test_patch_engine_id_follows_the_engine_source():
    import hashlib
    src = planmod._PATCH_ENGINE.read_bytes()
    assert planmod.patch_engine_id() == hashlib.sha256(src).hexdigest()[:8]
