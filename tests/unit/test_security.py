"""The hostile read (issue 20) on pure functions: every value that reaches a unit file, an env file, a crontab,
a timer or HAProxy's config is held to that format's own line rules; the managed flags cannot be set again from
extra_args under any spelling; secrets keep their type; inputs that become paths or shell words are checked at
the edge.  docs/security.md lists each rule with the test that holds it."""
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_plan import DRAFTER
from test_render_golden import settings

from deployer import schedule as sc
from deployer.host.module_utils import envfile
from deployer.plan import PlanError, make_plan
from helpers import ROOT

# Every character systemd (\n \r NUL), Python's str.splitlines (also \v \f \x1c-\x1e \x85 \u2028 \u2029) or a
# terminal treats as the end of a line or a control: none may reach a line-oriented file.
LINE_ENDS = ["\n", "\r", "\x00", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\x1b"]


# ------------------------------------------------------------------ 2: line ends, per format
@pytest.mark.parametrize("ch", LINE_ENDS, ids=[f"U+{ord(c):04X}" for c in LINE_ENDS])
def test_an_argv_word_with_any_line_end_is_refused_before_anything_changes(ch):
    # guards: "x\rUser=root" in extra_args was installed and cut the unit's ExecStart at the \r
    with pytest.raises(PlanError, match=r"U\+%04X" % ord(ch)):
        make_plan(settings(extra_args=["--root-path", f"/x{ch}User=root"]), DRAFTER)


@pytest.mark.parametrize("ch", LINE_ENDS, ids=[f"U+{ord(c):04X}" for c in LINE_ENDS])
def test_an_env_value_or_secret_with_any_line_end_is_refused_at_plan_time(ch):
    with pytest.raises(PlanError, match=r"U\+%04X" % ord(ch)) as e:
        make_plan(settings(env_extra={"WANDB_API_KEY": f"s3cret{ch}VLLM_API_KEY=x"}), DRAFTER)
    assert "WANDB_API_KEY" in str(e.value) and "s3cret" not in str(e.value)    # issue 53 N13: never echoed
    with pytest.raises(PlanError, match=r"api_key.*U\+%04X" % ord(ch)):
        make_plan(settings(api_key=f"k{ch}HF_TOKEN=x"), DRAFTER)


def test_the_env_file_reader_splits_lines_where_systemd_does():
    # guards: splitlines() split inside a value at \x0c, \x1c, \x85 ... (systemd does not): the read-back key was
    # not the one the server got
    text = 'A="x\x0cy\x85z"\nB="w"\r\n'
    assert envfile.parse(text) == {"A": "x\x0cy\x85z", "B": "w"}
    for ch in LINE_ENDS:
        with pytest.raises(envfile.EnvFileError):
            envfile.quote(f"a{ch}b")


@pytest.mark.parametrize("ch", LINE_ENDS + ["%"], ids=[f"U+{ord(c):04X}" for c in LINE_ENDS + ["%"]])
def test_cron_and_timer_lines_follow_their_formats(ch, tmp_path, monkeypatch):
    s = sc.Schedule(id="abc", at="03:00", target=["--sandbox"])
    if ch == "%":
        # cron: a bare % ends the command (the rest goes to stdin); the timer: a bare % is a specifier
        line = sc.cron_line(s, "/opt/50%/bin/deployer")
        assert "/opt/50\\%/bin/deployer" in line and "50%/" not in line.replace("\\%", "")
        units = sc.timer_units(s, "/opt/50%/bin/deployer")
        assert 'ExecStart="/opt/50%%/bin/deployer" "schedule" "run" "abc"' in units["deployer-schedule-abc.service"]
        return
    with pytest.raises(sc.ScheduleError):
        sc.cron_line(s, f"/opt/x{ch}y/deployer")
    with pytest.raises(sc.ScheduleError):
        sc.timer_units(s, f"/opt/x{ch}y/deployer")
    with pytest.raises(sc.ScheduleError):
        sc.parse_at(f"{ch}Sun 03:00")


def test_timer_execstart_is_quoted():
    # guards: ExecStart={deployer} was written unquoted: a space in the path split it into two words
    units = sc.timer_units(sc.Schedule(id="abc", at="03:00", target=[]), "/opt/my tools/bin/deployer")
    assert 'ExecStart="/opt/my tools/bin/deployer" "schedule" "run" "abc"\n' in units["deployer-schedule-abc.service"]


@pytest.mark.parametrize("bad", ["10.0.0.1 backup", "10.0.0.1\nserver evil 6.6.6.6:80", "a#b", "10.0.0.1\r"])
def test_haproxy_words_are_plain_tokens(bad):
    from deployer.host.module_utils import formats
    with pytest.raises(formats.FormatError):
        formats.haproxy_word(bad)
    assert formats.haproxy_word("gpu-1.example") == "gpu-1.example"
    assert formats.haproxy_word("[2001:db8::1]") == "[2001:db8::1]"


def _render_haproxy(tmp_path, hosts):
    inv = {"all": {"children": {"gpu": {"hosts": hosts}, "balancer": {"hosts": {"lb": {}}}}}}
    (tmp_path / "inv.yml").write_text(yaml.safe_dump(inv))
    pb = [{"hosts": "lb", "gather_facts": False, "connection": "local",
           # the role's defaults and vars, as the role sees them
           "vars": dict(yaml.safe_load((ROOT / "roles/balancer/defaults/main.yml").read_text()),
                        **yaml.safe_load((ROOT / "roles/balancer/vars/main.yml").read_text()),
                        role_path=str(ROOT / "roles/balancer")),
           "tasks": [{"ansible.builtin.template": {"src": str(ROOT / "roles/balancer/templates/haproxy.cfg.j2"),
                                                   "dest": str(tmp_path / "haproxy.cfg")}}]}]
    (tmp_path / "pb.yml").write_text(yaml.safe_dump(pb))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_LOCALHOST_WARNING="False")
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "inv.yml"),
                           str(tmp_path / "pb.yml")], capture_output=True, text=True, env=env, cwd=ROOT)


def test_haproxy_config_drops_root_and_refuses_a_value_that_would_add_a_line(tmp_path):
    # guards (5): the rendered config lost Debian's user/group/chroot, so HAProxy's worker ran as root
    r = _render_haproxy(tmp_path, {"g1": {"ansible_host": "10.0.0.1", "deployer_port": 8000}})
    assert r.returncode == 0, r.stdout + r.stderr
    cfg = (tmp_path / "haproxy.cfg").read_text()
    glob = cfg.split("\ndefaults")[0]
    assert "\n    user haproxy\n" in glob and "\n    group haproxy\n" in glob
    assert "\n    chroot /var/lib/haproxy\n" in glob
    r = _render_haproxy(tmp_path, {"g1": {"ansible_host": "10.0.0.1\n    server evil 203.0.113.9:80 check"}})
    assert r.returncode != 0 and "U+000A" in r.stdout + r.stderr


# ------------------------------------------------------------------ 3: the managed flags, any spelling
@pytest.mark.parametrize("words", [
    ["--ho", "0.0.0.0"], ["--hos=0.0.0.0"], ["--po", "9"], ["--tr"], ["--api-k", "x"],
    ["--speculative-config.model", "/tmp/other"], ["--speculative_config.num_speculative_tokens=9"],
    ["--config", "/tmp/flags.yaml"], ["--no-trust-remote-code"], ["--ser", "x"],
])
def test_extra_args_cannot_set_a_managed_flag_under_any_spelling(words):
    # guards: --ho 0.0.0.0 passed (prefixes were checked only when longer than 4 chars) and argparse took it as
    # --host: a loopback deploy without a key served on every interface
    with pytest.raises(PlanError, match="extra_args"):
        make_plan(settings(extra_args=words), DRAFTER)


def test_unmanaged_flags_still_pass():
    p = make_plan(settings(extra_args=["--max-num-batched-tokens", "4096", "--enable-prefix-caching",
                                       "--hf-overrides", "{}"]), DRAFTER)
    assert p["argv"][-5:] == ["--max-num-batched-tokens", "4096", "--enable-prefix-caching", "--hf-overrides", "{}"]


def test_sglang_extra_args_cannot_set_a_managed_flag_either():
    with pytest.raises(PlanError, match="extra_args"):
        make_plan(settings(backend="sglang", sglang_version="0.5.23", sglang_extra_args=["--ho", "0.0.0.0"]), DRAFTER)
    with pytest.raises(PlanError, match="extra_args"):
        make_plan(settings(backend="sglang", sglang_version="0.5.23", sglang_extra_args=["--config", "/x.yaml"]),
                  DRAFTER)


# ------------------------------------------------------------------ 7: secrets keep their type
@pytest.mark.parametrize("raw", ["0777", "1:30", "1e3", "true", "0x1F", "null"])
def test_a_secret_from_the_command_line_stays_the_string_typed(raw):
    # guards: -e deployer_api_key=0777 became the integer 511 (YAML 1.1 octal), 1:30 became 90 (sexagesimal)
    from deployer.cli.targets import parse_extra
    assert parse_extra([f"deployer_api_key={raw}"])["deployer_api_key"] == raw
    assert parse_extra([f"deployer_hf_token={raw}"])["deployer_hf_token"] == raw
    assert parse_extra([f"deployer_served_model_name={raw}"])["deployer_served_model_name"] == raw


def test_a_secret_that_is_not_a_string_is_refused():
    import typer

    from deployer.cli.targets import parse_extra
    with pytest.raises(typer.Exit) as e:
        parse_extra(['{"deployer_api_key": 511}'])
    assert e.value.exit_code == 2
    with pytest.raises(PlanError, match="api_key: got an int"):
        make_plan(settings(api_key=511), DRAFTER)
    with pytest.raises(PlanError, match="hf_token: got a float"):
        make_plan(settings(hf_token=1.5), DRAFTER)


# ------------------------------------------------------------------ 11: input that becomes paths and shell words
@pytest.mark.parametrize("key,value", [
    ("service_name", "../../tmp/x"), ("service_name", "a b"), ("service_name", "x;reboot"),
    ("service_name", "x.service"), ("service_name", ""),
    ("vllm_version", "0.16.0/../../x"), ("vllm_version", "0.16 0"), ("vllm_version", "latest"),
])
def test_inputs_that_become_paths_are_checked_at_the_edge(key, value):
    with pytest.raises(PlanError, match=key):
        make_plan(settings(**{key: value}), DRAFTER)


@pytest.mark.parametrize("to", ["../x", "/etc", "abc/def", "..", "a" * 80])
def test_rollback_to_must_be_a_release_id(to):
    import typer

    from deployer.cli.deploy import check_release_id
    with pytest.raises(typer.Exit) as e:
        check_release_id(to)
    assert e.value.exit_code == 2
    assert check_release_id("3c5572e4f21b") == "3c5572e4f21b"


# ------------------------------------------------------------------ 12: probe the address the server binds
@pytest.mark.parametrize("bind,probe", [("0.0.0.0", "127.0.0.1"), ("127.0.0.1", "127.0.0.1"), ("::", "::1"),
                                        ("::1", "::1"), ("10.0.0.5", "10.0.0.5"), ("localhost", "localhost")])
def test_the_probe_address_is_the_bound_one(bind, probe):
    # guards: health, watch and smoke always asked 127.0.0.1: a server bound to 10.0.0.5 never became ready
    p = make_plan(settings(host=bind, api_key="k"), DRAFTER)
    assert p["probe_host"] == probe
    assert p["probe_url"] == (f"http://[{probe}]:8000" if ":" in probe else f"http://{probe}:8000")


# ------------------------------------------------------------------ 6: schedules
def test_schedule_add_refuses_secrets_in_every_form_of_extra_vars(tmp_path):
    from deployer.cli.schedule_cmd import secret_in_extra
    f = tmp_path / "vars.yml"
    f.write_text("deployer_api_key: s3cret\n")
    assert secret_in_extra(["deployer_api_key=x"]) == "deployer_api_key"
    assert secret_in_extra(['{"deployer_hf_token": "x"}']) == "deployer_hf_token"
    assert secret_in_extra([f"@{f}"]) == "deployer_api_key"
    assert secret_in_extra(["deployer_port=8000"]) == ""


def test_schedules_file_is_private_and_webhooks_redacted(tmp_path, monkeypatch):
    monkeypatch.setattr(sc, "CONFIG", tmp_path / "deployer" / "schedules.json")
    s = sc.Schedule(id="abc", at="03:00", target=["--sandbox"], webhook="https://hooks.example/T0K3N/x?sig=abc")
    sc.save({"abc": s})
    assert stat.S_IMODE(sc.CONFIG.stat().st_mode) == 0o600
    assert stat.S_IMODE(sc.CONFIG.parent.stat().st_mode) == 0o700
    assert sc.redact_url(s.webhook) == "https://hooks.example/..."
    assert "T0K3N" not in json.dumps(sc.public_view(s))


def test_relative_paths_in_a_schedule_are_stored_absolute(tmp_path, monkeypatch):
    # guards: -e @vars.yml and --key k were stored as given and every scheduled run (cwd /) failed
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vars.yml").write_text("deployer_port: 8000\n")
    assert sc.absolute_extra(["@vars.yml", "deployer_port=1"]) == [f"@{tmp_path}/vars.yml", "deployer_port=1"]
    from deployer.cli.targets import Target
    words = Target(host="192.0.2.1", key="id_ed25519").schedule_words()
    assert words[words.index("--key") + 1] == f"{tmp_path}/id_ed25519"


def test_a_webhook_redirect_is_not_a_delivery(monkeypatch):
    # guards: requests followed a 302, turned the POST into a GET, and the GET's 200 counted as delivered
    import requests
    calls = []

    class R:
        status_code = 302
        is_redirect = True

        def raise_for_status(self):
            pass

    def post(url, **kw):
        calls.append(kw)
        return R()
    monkeypatch.setattr(requests, "post", post)
    err = sc.notify("https://hooks.example/T0K3N", {"event": "x"}, attempts=1)
    assert calls and calls[0].get("allow_redirects") is False
    assert err and "302" in err and "T0K3N" not in err


# ------------------------------------------------------------------ 9: deployer logs
@pytest.mark.parametrize("service", ["x; rm -rf /", "$(id)", "a b", "../x", "x\n"])
def test_logs_refuses_a_service_name_that_is_not_one(service):
    from deployer.cli.views import journal_command
    with pytest.raises(ValueError):
        journal_command(service, 100, False, True)
    assert journal_command("deployer-engine", 5, True, False) == "sudo -n journalctl -u deployer-engine.service " \
                                                              "--no-pager -n 5 -f"


def test_logs_refuses_an_unknown_host_key(tmp_path):
    import paramiko

    from deployer.cli.views import ssh_connection
    conn = ssh_connection("192.0.2.1", "root", 22, None, known_hosts=tmp_path / "known_hosts")
    assert isinstance(conn.client._policy, paramiko.RejectPolicy)


# ------------------------------------------------------------------ 4: who holds the lock
def test_a_lock_holder_is_judged_by_machine_boot_pid_and_start_time():
    from deployer import controller_id as cid
    me = cid.identity(os.getpid())
    assert me["machine_id"] and me["boot_id"] and me["pid_start"]
    alive = dict(me, controller="x")
    assert cid.holder_state(alive, me)[0] == "alive"
    # same host name, another machine: its pid means nothing here (was: taken over when that pid was free here)
    assert cid.holder_state(dict(alive, machine_id="f" * 32), me)[0] == "unknown"
    # a pid of this machine that now names another process (pid reuse): the holder is gone
    assert cid.holder_state(dict(alive, pid_start="1"), me) [0] == "gone"
    assert cid.holder_state(dict(alive, pid=2 ** 22 + 7), me)[0] == "gone"
    assert cid.holder_state(dict(alive, boot_id="0"), me)[0] == "gone"
    # a record without the identity (an older deployer's): only its time-to-live may free it
    assert cid.holder_state({"controller": "x", "pid": 2 ** 22 + 7}, me)[0] == "unknown"


# ------------------------------------------------------------------ 13: disk given back
def test_an_abandoned_drafter_copy_is_collected_but_the_running_ones_is_not():
    # guards: .incoming-* staging dirs of interrupted copies were never collected
    from deployer.host.module_utils.releases import plan_collect
    present = ["aaaa", ".incoming-bbbb", ".incoming-cccc", ".trash-dddd"]
    kept = [{"drafter_dir": "/d/aaaa"}]
    assert plan_collect("/d", present, kept, "drafter_dir", in_use=["/d/cccc"]) == [".incoming-bbbb", ".trash-dddd"]


def test_removing_a_venv_gives_back_the_uv_cache_entries_only_it_used(tmp_path):
    # guards: venvs are hard links into <root>/cache/uv, which nothing pruned: removing a venv freed almost nothing
    from deployer.host.module_utils.releases import prune, unused_uv_archives
    cache = tmp_path / "cache" / "uv" / "archive-v0"
    venvs, rels = tmp_path / "venvs", tmp_path / "releases"
    for name in ("only-old", "shared"):
        (cache / name).mkdir(parents=True)
        (cache / name / "mod.py").write_text(name)
    for v in ("old", "new"):
        (venvs / v / "lib").mkdir(parents=True)
    os.link(cache / "only-old" / "mod.py", venvs / "old" / "lib" / "mod.py")
    os.link(cache / "shared" / "mod.py", venvs / "old" / "lib" / "shared.py")
    os.link(cache / "shared" / "mod.py", venvs / "new" / "lib" / "shared.py")
    rels.mkdir()
    for i, v in enumerate(("new", "new")):
        (rels / f"r{i}").mkdir()
        (rels / f"r{i}" / "release.json").write_text(json.dumps({"venv": str(venvs / v), "deployed_at": i}))
    assert unused_uv_archives(tmp_path / "cache" / "uv") == []
    _removed, _kept, collected = prune(str(rels), 5, [], str(venvs), None, (), False, str(tmp_path / "cache" / "uv"))
    assert str(venvs / "old") in collected and str(cache / "only-old") in collected
    assert not (cache / "only-old").exists() and (cache / "shared" / "mod.py").read_text() == "shared"
    assert (venvs / "new" / "lib" / "shared.py").exists()


def test_haproxy_waits_for_a_check_as_long_as_the_slowest_engines_health(tmp_path):
    """HAProxy's check timeout is 'inter' (2 s) when unset; SGLang's /health generates a token (up to 20 s)."""
    r = _render_haproxy(tmp_path, {"g1": {"ansible_host": "10.0.0.1"}})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "\n    timeout check 2s\n" in (tmp_path / "haproxy.cfg").read_text()
    r = _render_haproxy(tmp_path, {"g1": {"ansible_host": "10.0.0.1"},
                                   "g2": {"ansible_host": "10.0.0.2", "deployer_backend": "sglang"}})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "\n    timeout check 22s\n" in (tmp_path / "haproxy.cfg").read_text()


def test_logs_checks_a_real_host_against_the_user_s_and_the_system_s_known_hosts(tmp_path, monkeypatch):
    """`deployer logs --host` loaded no known_hosts at all: with RejectPolicy every real host was refused (issue 40,
    F14).  A key in ~/.ssh/known_hosts is known; the unit name may carry its .service."""
    from deployer.cli.views import journal_command, ssh_connection
    key = "AAAAC3NzaC1lZDI1NTE5AAAAIDk8dNf0pUGuUYQ0i6HiJ4Jc4s7IcycvWi5gO3pCIRhm"
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "known_hosts").write_text(f"192.0.2.7 ssh-ed25519 {key}\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    conn = ssh_connection("192.0.2.7", "root", 22, None)
    assert conn.client.get_host_keys().lookup("192.0.2.7")
    assert not conn.client.get_host_keys().lookup("192.0.2.8")
    assert "deployer-engine.service" in journal_command("deployer-engine.service", 10, False, True)
    with pytest.raises(ValueError):
        journal_command("x\\yservice", 10, False, True)
