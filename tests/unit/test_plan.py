"""deployer/plan.py: the checks that refuse a deploy before anything changes, and what the plan decides
for the service (user, caches, venv per patch engine).  Each test names what it guards."""
import json

import pytest
from test_render_golden import settings

from deployer import identity, noop
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
    # guards: the server never runs as root.  "" fell back to a second copy of the default until issue 43 (each
    # default once): it is refused like any malformed name, with the setting named
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
    assert a["venv"] == f"/opt/deployer/venvs/vllm-0.16.0-p{identity.patch_engine_id()}"
    monkeypatch.setattr(identity, "patch_engine_id", lambda: "deadbeef")
    b = make_plan(settings(patch_engine_id=None), DRAFTER)
    assert b["venv"].endswith("-pdeadbeef") and b["venv"] != a["venv"]
    assert identity.release_id(a, "fp") != identity.release_id(b, "fp")     # argv names the venv
    assert make_plan(settings(patch_enabled=False), DRAFTER)["venv"] == "/opt/deployer/venvs/vllm-0.16.0"


def test_the_log_line_wrapper_is_named_by_its_content_and_part_of_the_release():
    import hashlib
    on, off = make_plan(settings(), DRAFTER), make_plan(settings(log_line_splitter=False), DRAFTER)
    sha = hashlib.sha256(identity._LINE_SPLITTER.read_bytes()).hexdigest()
    assert on["unit"]["line_splitter"] == f"/opt/deployer/bin/journal_lines-{sha[:12]}.py"
    assert off["unit"]["line_splitter"] is None
    assert identity.release_id(on, "fp") != identity.release_id(off, "fp")
    with pytest.raises(planmod.PlanError, match="log_line_splitter: got 'no', expected true or false"):
        make_plan(settings(log_line_splitter="no"), DRAFTER)


def test_patch_engine_id_follows_the_engine_source(tmp_path, monkeypatch):
    """The id names the patch engine's code, not its place (issue 24 item 9: this re-implemented the function): a
    copy elsewhere has the same id; changed code, another id (a patched venv of another engine is never reused)."""
    ours = identity.patch_engine_id()
    assert len(ours) == 8 and int(ours, 16) >= 0
    copy = tmp_path / "eagle3_patch.py"
    copy.write_bytes(identity._PATCH_ENGINE.read_bytes())
    monkeypatch.setattr(identity, "_PATCH_ENGINE", copy)
    assert identity.patch_engine_id() == ours
    # a comment or a blank line is not what the engine does: the patched venvs keep their name (issue 43)
    copy.write_bytes(copy.read_bytes().replace(b"\nimport ", b"\n# a comment\n\nimport ", 1) + b"\n# one more line\n")
    assert identity.patch_engine_id() == ours
    copy.write_bytes(copy.read_bytes() + b"\nX = 1\n")         # code: another engine, another venv
    assert identity.patch_engine_id() != ours


# ------------------------------------------------------------------ the no-op check
import hashlib  # noqa: E402


def _live(**over):
    """A host where the planned release is live and healthy, as deployer_state's probe reports it (the GPU gate on,
    as roles/deployer/vars/main/settings.yml passes preflight_gpu_health's default)."""
    p = make_plan(settings(gpu_gate=True), DRAFTER)
    exp = noop.expected_release(p, {"probe": {"venv": {"installed": True, "state": "patched",
                                                          "fingerprint": "fp1", "patches": ["P1"]}}})
    state = {"lock": None, "current": exp["id"], "unit_sha256": "u", "probe": {
        "venv": {"installed": True, "state": "patched", "fingerprint": "fp1", "patches": ["P1"]},
        "drafter_complete": True, "drafter_changed": [], "live_edited": [], "live_env_sha256": "e",
        "live_unit_sha256": "u", "health": 200,
        "files_sha256": {p["unit"]["line_splitter"]: identity.line_splitter_sha256(),
                         p["secrets"]["dropin_path"]: hashlib.sha256(p["secrets"]["dropin"].encode()).hexdigest(),
                         # the host's state keeper: its files as shipped, its unit as rendered ("k")
                         **{h: hashlib.sha256(open(src, "rb").read()).hexdigest()
                            for h, src in p["state_keeper"]["files"].items()},
                         p["state_keeper"]["unit_path"]: "k",
                         # the GPU health gate: its files as shipped, its drop-in as planned
                         **{h: hashlib.sha256(open(src, "rb").read()).hexdigest()
                            for h, src in p["gpu_gate"]["files"].items()},
                         p["gpu_gate"]["dropin_path"]: hashlib.sha256(p["gpu_gate"]["dropin"].encode()).hexdigest()},
        "secrets_current": True,
        "unit": {"ActiveState": "active", "SubState": "running", "NeedDaemonReload": "no"}}}
    for k, v in over.items():
        (state["probe"] if k in state["probe"] else state)[k] = v
    return p, state


def test_noop_when_everything_matches():
    p, st = _live()
    exp = noop.expected_release(p, st)
    got = noop.noop_check(exp, st, p, "u", "e", "k")
    assert got["noop"] and got["reasons"] == [] and got["fingerprint"] == "fp1" and got["patches"] == ["P1"]
    # a keeper that differs (a newer deployer's) is shipped by the full path: same release, nothing restarted
    got = noop.noop_check(exp, st, p, "u", "e", "k2")
    assert not got["noop"] and got["reasons"] == ["the host's state keeper is missing or differs: "
                                                  "/etc/systemd/system/deployer-state.service"]


def test_the_gpu_gate_is_a_drop_in_outside_the_release_and_a_missing_one_is_shipped_without_a_new_release():
    """Issue 55: the gate runs before every start systemd makes (ExecStartPre=+, root); turning it on or off, or a
    host without it (an older deployer's), is shipped by the full path: the same release id, nothing restarted."""
    p, st = _live()
    exp = noop.expected_release(p, st)
    gate = p["gpu_gate"]
    assert gate["dropin_path"] == "/etc/systemd/system/deployer-engine.service.d/deployer-gpu-gate.conf"
    assert gate["dropin"].splitlines()[1:] == [
        "[Service]", 'ExecStartPre=+/usr/bin/python3 "-I" "/opt/deployer/bin/gpu-gate/gpu_gate.py" "--service" '
        '"deployer-engine" "--since-epoch" "0"']
    assert sorted(gate["files"]) == ["/opt/deployer/bin/gpu-gate/ansible/__init__.py",
                                     "/opt/deployer/bin/gpu-gate/ansible/module_utils/__init__.py",
                                     "/opt/deployer/bin/gpu-gate/ansible/module_utils/gpu_health.py",
                                     "/opt/deployer/bin/gpu-gate/gpu_gate.py"]
    off = make_plan(settings(gpu_gate=False, gpu_health_since_epoch=1796670000), DRAFTER)
    assert "ExecStartPre" not in off["gpu_gate"]["dropin"] and identity.release_id(off, None) == \
        identity.release_id(p, None) == identity.release_id(make_plan(settings(gpu_gate=True,
                                                                                gpu_health_since_epoch=9), DRAFTER),
                                                            None)
    del st["probe"]["files_sha256"][gate["dropin_path"]]
    got = noop.noop_check(exp, st, p, "u", "e", "k")
    assert got["reasons"] == [f"the GPU health gate is missing or differs: {gate['dropin_path']}"]
    with pytest.raises(PlanError, match="preflight_gpu_health_since_epoch"):
        make_plan(settings(gpu_health_since_epoch=-1), DRAFTER)


@pytest.mark.parametrize("over,unit,env,reason", [
    ({"lock": {"user": "x"}}, "u", "e", "a deploy lock is held"),
    ({"current": "other"}, "u", "e", "live release other, planned"),
    ({"drafter_complete": False}, "u", "e", "the drafter is not in the store"),
    ({}, "u2", "e", "the unit systemd runs differs"),
    ({"unit_sha256": "tampered"}, "u", "e", "the unit systemd runs differs"),
    ({}, "u", "e2", "the live environment file differs"),
    ({"health": 503}, "u", "e", "/health answered 503"),
    ({"files_sha256": {}}, "u", "e", "the log-line wrapper /opt/deployer/bin/journal_lines-"),
    ({"files_sha256": {"x": None}}, "u", "e", "is missing or differs from the planned one"),
    # the live secrets live outside every release: a rotated key is found and applied though the release is the same
    ({"secrets_current": False}, "u", "e", "the live secrets differ from the ones given (rotated?)"),
    ({"files_sha256": {}}, "u", "e", "deployer-secrets.conf (the live secrets) is missing or differs"),
    ({"unit": {"ActiveState": "activating", "SubState": "auto-restart", "NeedDaemonReload": "no"}}, "u", "e",
     "the server is activating/auto-restart"),
    ({"unit": {"ActiveState": "active", "SubState": "running", "NeedDaemonReload": "yes"}}, "u", "e",
     "(unit changed on disk)"),
    ({"venv": {"installed": False}}, "u", "e", "is not installed"),
    ({"venv": {"installed": True, "state": "error", "error": "drift: x.py"}}, "u", "e", "drift: x.py"),
    ({"venv": {"installed": True, "state": "unpatched"}}, "u", "e", "EAGLE-3 patches not applied (unpatched)"),
    ({"drafter_changed": ["model.safetensors (modified after it was shipped)"]}, "u", "e",
     "the drafter changed on the host after it was shipped: model.safetensors (modified after it was shipped)"),
    ({"live_edited": ["argv.json"]}, "u", "e",
     "the live release's files were edited after they were rendered: argv.json"),
])
def test_anything_that_differs_runs_the_full_deploy(over, unit, env, reason):
    # guards: a no-op is decided on the host's truth; each difference is named
    p, st = _live(**over)
    got = noop.noop_check(noop.expected_release(p, st), st, p, unit, env)
    assert not got["noop"] and any(reason in r for r in got["reasons"]), got["reasons"]


def test_a_changed_patch_fingerprint_is_a_different_release():
    p, st = _live(venv={"installed": True, "state": "patched", "fingerprint": "fp2", "patches": ["P1"]})
    got = noop.noop_check(noop.expected_release(p, st), st, p, "u", "e")
    assert not got["noop"] and any("planned" in r for r in got["reasons"])


def test_an_edited_env_file_or_unit_is_named_once_not_twice():
    """The unit and env file are compared with the plan; the release's own record must not name them again."""
    p, st = _live(live_edited=["vllm.env"])
    got = noop.noop_check(noop.expected_release(p, st), st, p, "u", "e", "k")
    assert got["noop"] and got["reasons"] == []


# ------------------------------------------------------------------ the plan of a release on the host
def _manifest(p):
    """release.json as roles/render writes it (the fields release_plan reads)."""
    return {"id": "r1", "backend": p["backend"], "engine_version": p["engine"]["version"], "argv": p["argv"],
            "port": p["port"], "served_model_name": p["served_model_name"], "model_dir": p["model_dir"],
            "venv": p["venv"], "speculative": p["speculative"],
            "drafter_dir": p["drafter"]["dir"] if p["drafter"] else None}


SHARED = ("backend", "service", "unit_path", "port", "probe_host", "probe_url", "secrets", "served_model_name",
          "model_dir", "venv", "speculative", "draft_tokens_per_step", "dirs")


@pytest.mark.parametrize("over", [
    {}, {"host": "10.0.0.7", "port": 8123, "num_speculative_tokens": 5}, {"speculative_enabled": False},
    {"backend": "sglang"}, {"backend": "sglang", "num_speculative_tokens": 2, "host": "::"},
    {"backend": "sglang", "sglang_num_draft_tokens": 6, "num_speculative_tokens": 5},
    {"backend": "sglang", "speculative_enabled": False}])
def test_a_recorded_release_plans_as_it_was_deployed(over):
    # guards: a rollback (and the restore after a failed deploy) starts, watches and smoke-tests a release with the
    # engine, port, probe address and drafts per step it was deployed with, whatever the settings say now
    # (the YAML plan before it gave no drafts per step: a rollback to SGLang measured its acceptance from gauges
    # that a fresh server leaves at 0, so any acceptance floor failed it)
    p = make_plan(settings(**over), DRAFTER)
    now = settings(port=9999, served_model_name="other", backend="vllm", num_speculative_tokens=7)
    r = planmod.release_plan(_manifest(p), now)
    assert {k: r[k] for k in SHARED} == {k: p[k] for k in SHARED}
    assert r["engine"] == dict(p["engine"]) and r["drafter"] == ({"dir": p["drafter"]["dir"]} if p["drafter"] else None)
    assert r["draft_tokens_per_step"] == (0 if not p["speculative"] else p["draft_tokens_per_step"]) > -1


def test_an_older_manifest_takes_what_it_lacks_from_the_settings():
    r = planmod.release_plan({"argv": ["vllm", "serve", "/m", "--host", "127.0.0.1"]}, settings(port=8123))
    assert (r["backend"], r["port"], r["probe_host"], r["speculative"], r["drafter"]) == (
        "vllm", 8123, "127.0.0.1", False, None)
    assert r["served_model_name"] == settings()["served_model_name"]


def test_a_manifest_of_an_unknown_engine_is_refused_by_name():
    with pytest.raises(PlanError, match=r"release r9: backend: got 'tgi'"):
        planmod.release_plan({"id": "r9", "backend": "tgi"}, settings())


@pytest.mark.parametrize("over", [{}, {"backend": "sglang"}, {"speculative_enabled": False}])
def test_a_plan_bound_to_the_hosts_devices_is_the_plan_made_with_them(over):
    # guards: the run makes its plan once (before the host read) and binds the measured device classes after; the
    # bound plan must be exactly the one make_plan gives with them, down to the release id
    devices = ["char-nvidia-frontend rw", "char-nvidia-uvm rw", "/dev/nvidia-caps rw"]
    unbound = make_plan(settings(device_allow=[], **over), DRAFTER)
    bound = planmod.with_devices(unbound, devices)
    direct = make_plan(settings(device_allow=devices, **over), DRAFTER)
    assert bound == direct
    assert identity.release_id(bound, "f") == identity.release_id(direct, "f") != identity.release_id(unbound, "f")
    assert unbound["unit"]["device_allow"] == [] and unbound["release_inputs"]["devices"] == []   # not mutated
    with pytest.raises(PlanError, match="device_allow: got 'char-nvidia rw; rm'"):
        planmod.with_devices(unbound, ["char-nvidia rw; rm"])


def test_a_release_the_measured_matrix_refuses_is_refused_before_anything_is_installed(tmp_path, monkeypatch):
    """A vLLM whose EAGLE-3 path the patch engine cannot recognise (0.34.0 moved its spec-decode code) was found
    only by the patch stage, after a ~10 GB install; the plan now refuses it from deployer/data/compatibility.json,
    naming why and where to look.  A release the matrix has no row for is left to the patch engine."""
    import json

    from deployer import versions
    data = {"commit": "abc1234", "rows": [
        {"engine": "vLLM", "version": "0.16.0", "patch": "patched: P1", "verifier_missing": []},
        {"engine": "vLLM", "version": "0.40.0", "verifier_missing": [],
         "patch": "refused: vLLM 0.40.0: EAGLE proposer (v1/spec_decode/eagle.py) not recognised"}]}
    (tmp_path / "m.json").write_text(json.dumps(data))
    monkeypatch.setattr(versions, "DATA", tmp_path / "m.json")
    monkeypatch.setattr(versions, "_LOADED", {})
    with pytest.raises(PlanError) as e:
        make_plan(settings(vllm_version="0.40.0"), DRAFTER)
    msg = " ".join(str(e.value).split())
    assert msg.startswith("vLLM 0.40.0 cannot serve Kimi-K2.5 with EAGLE-3 as measured from its own wheel"), msg
    assert "EAGLE proposer (v1/spec_decode/eagle.py) not recognised" in msg and "deployer commit abc1234" in msg
    assert "deployer_vllm_version" in msg and msg.count("vLLM 0.40.0") == 1, msg
    assert make_plan(settings(vllm_version="0.16.0"), DRAFTER)["vllm_version"] == "0.16.0"
    assert make_plan(settings(vllm_version="0.41.0"), DRAFTER)["vllm_version"] == "0.41.0"   # not measured


def test_the_installs_own_pins_name_the_venv_so_a_changed_pin_never_reinstalls_the_live_one():
    """install_overrides / install_extra_packages were not in the venv's name: a changed override found the old venv
    complete and installed nothing (issue 55).  No pins: the name (and the golden release ids) as before."""
    drafter = {"src": "/d", "files": [], "tree_sha256": "0" * 64, "bytes": 0}
    plain = make_plan(settings(), drafter)["venv"]
    a = make_plan(settings(install_packages=["torch==2.13.0"]), drafter)
    b = make_plan(settings(install_packages=["torch==2.12.0"]), drafter)
    assert make_plan(settings(install_packages=[]), drafter)["venv"] == plain
    assert a["venv"].startswith(plain + "-x") and len(a["venv"]) == len(plain) + 10
    assert a["venv"] != b["venv"] and a["python"] == a["venv"] + "/bin/python"
    assert a["venv"] in " ".join(a["argv"]) and identity.release_id(a, None) != identity.release_id(b, None)
    two = ["torch==2.13.0", "flashinfer-cubin==0.6.9"]
    assert make_plan(settings(install_packages=two), drafter)["venv"] == \
        make_plan(settings(install_packages=two[::-1]), drafter)["venv"]
    with pytest.raises(PlanError, match="install_overrides / install_extra_packages"):
        make_plan(settings(install_packages="torch==2.13.0"), drafter)


def test_speculation_up_to_a_batch_size_is_vllms_schedule_and_refused_for_sglang():
    """deployer_speculation_max_batch_size: vLLM's num_speculative_tokens_per_batch_size in the launch (tests/vllm
    holds it to the wheels' own code); SGLang has no such schedule: refused by the plan, naming the way out."""
    argv = make_plan(settings(speculation_max_batch_size=8), DRAFTER)["argv"]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 8, 3], [9, 9, 0]]
    with pytest.raises(PlanError, match="SGLang has no per-batch-size speculation schedule"):
        make_plan(settings(backend="sglang", sglang_version="0.5.23", speculation_max_batch_size=8), DRAFTER)
    make_plan(settings(backend="sglang", sglang_version="0.5.23", speculation_max_batch_size=0), DRAFTER)
