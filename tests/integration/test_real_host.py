"""What a real GPU host needs beyond "it serves" (issue #11), on one sandbox host with real systemd:
an unprivileged, confined server; no open API by accident; warm caches across releases; the page
cache prewarmed before the stop; downtime measured; venvs and drafters collected.  Each test says
what it guards: it fails on a build without that property."""
import json
import re

import pytest

from deployer.sandbox.common import SMALL_MODEL_DIR
from sandbox_helpers import FAST, SVC, deployer, flat, main_pid, needs_sandbox, sandbox_hosts, sh, up, venv

pytestmark = [pytest.mark.sandbox, needs_sandbox]
H = "sbx1"


@pytest.fixture(scope="module", autouse=True)
def sandbox():
    yield from sandbox_hosts(1, seed=False, engines=("vllm-0.18.0",))   # the whole cold deploy is the point here


def manifest(rel="current"):
    return json.loads(sh(H, f"cat /opt/deployer/{rel}/release.json"))


def in_unit(cmd, as_service_user=True):
    """Run ``cmd`` inside the live server's mount namespace (what ProtectSystem= etc. made of the file
    system), as the service user or as root; returns 'ok' or the error."""
    ids = "-S $(id -u vllm) -G $(id -g vllm)" if as_service_user else ""
    return sh(H, f"nsenter -t $(systemctl show -p MainPID --value {SVC}) -m {ids} -- sh -c '{cmd}' 2>&1 "
                 "&& echo ok || true")


def test_01_server_runs_unprivileged_and_confined():
    # install_compile_bytecode: the product's default (the sandbox turns it off); watch_budget_seconds=1: a host's
    # first load (nothing recorded yet) has watch_first_budget_seconds instead (test_faults_load: later loads get it)
    r = up("-e", "install_compile_bytecode=true", "-e", "watch_budget_seconds=1")
    assert r.returncode == 0, r.stdout + r.stderr
    # guards: the venv is compiled to bytecode as it is installed, as root: the service user cannot write .pyc into
    # it, so without them every start would compile what it imports in memory
    vdir = sh(H, "ls -d /opt/deployer/venvs/vllm-*")
    py, pyc = (int(sh(H, f"find {vdir}/lib -name '*.{x}' | wc -l")) for x in ("py", "pyc"))
    assert pyc >= 0.9 * py, (py, pyc)
    pid = main_pid(H)
    # guards: the server never runs as root
    assert sh(H, f"ps -o user= -p {pid}") == "vllm"
    status = sh(H, f"cat /proc/{pid}/status")
    assert re.search(r"^NoNewPrivs:\s+1$", status, re.M) and re.search(r"^CapEff:\s+0+$", status, re.M), status
    # guards: the service user may write only its caches; the deploy root, venvs, model and /etc are
    # read-only to the whole unit (ProtectSystem=strict), even to a root process inside it
    for path in ("/opt/deployer/releases/x", "/opt/deployer/venvs/x", "/srv/models/Kimi-K2.5/x", "/etc/x",
                 "/root/x", "/home/x"):
        assert in_unit(f"touch {path}") != "ok", path
    for path in ("/opt/deployer/venvs/x", "/srv/models/Kimi-K2.5/x", "/opt/deployer/current/x"):
        assert "Read-only file system" in in_unit(f"touch {path}", as_service_user=False), path
    assert in_unit("touch /opt/deployer/cache/server/vllm/probe && touch /tmp/probe") == "ok"
    # the unit systemd runs says so itself (systemd-analyze's exposure score: 9.6 for the unhardened unit)
    score = float(re.search(r"Overall exposure level for \S+: (\d+\.\d+)",
                            sh(H, f"systemd-analyze security {SVC} --no-pager")).group(1))
    assert score <= 4.0, score
    # the deploy root is root's; the secrets file is root's 0600; nothing is world-writable
    assert sh(H, "stat -c '%U %a' /opt/deployer /opt/deployer/current/vllm.env") == "root 755\nroot 600"
    assert sh(H, "find /opt/deployer -path /opt/deployer/cache -prune -o -perm -o+w ! -type l -print") == ""
    assert sh(H, "stat -c '%U %a' /opt/deployer/cache/server") == "vllm 750"


def test_02_open_api_is_refused_before_anything_changes():
    before = (main_pid(H), sh(H, "readlink /opt/deployer/current"), sh(H, "ls /opt/deployer/releases"))
    # guards: a non-loopback server with no API key never deploys by accident
    r = up("-e", "deployer_api_key=", "-e", "deployer_max_model_len=4096")
    assert r.returncode == 3, r.stdout + r.stderr
    err = flat(r.stderr)
    assert "host: got '0.0.0.0' with no API key" in err and "deployer_allow_unauthenticated: true" in err, err
    assert (main_pid(H), sh(H, "readlink /opt/deployer/current"), sh(H, "ls /opt/deployer/releases")) == before
    # the explicit override is accepted (check mode: nothing changes) and status says what the live release exposes
    r = up("--check", "-e", "deployer_api_key=", "-e", "deployer_allow_unauthenticated=true")
    assert r.returncode == 0, r.stdout + r.stderr
    r = deployer("status", "--sandbox")
    assert "API /v1 with the API key, /health and /metrics; every other path refused (API guard)" in flat(r.stdout), \
        r.stdout
    assert json.loads(deployer("releases", "--sandbox", "--json").stdout)[H]["releases"][0]["api_protected"] is True
    # guards (issue 53 N4): an account someone else made is never taken as the service user (usermod'ed, handed to
    # the checkpoint's remote code); refused before anything changes, the account as it was
    sh(H, "id postgres >/dev/null 2>&1 || useradd -r -d /var/lib/postgresql -s /bin/bash -c 'PostgreSQL administrator' "
          "postgres")
    passwd = sh(H, "getent passwd postgres")
    r = up("-e", "deployer_service_user=postgres")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "service user postgres: an existing account the deployer did not create" in flat(r.stderr), r.stderr
    assert sh(H, "getent passwd postgres") == passwd and main_pid(H) == before[0]
    # guards (issue 53 N8): an extra package reaches uv's argv as root; a URL or an option is refused before the install
    r = up("-e", json.dumps({"install_extra_packages": ["--extra-index-url=http://192.0.2.1/simple", "six==1.16.0"]}),
           "-e", "deployer_max_model_len=4096")
    assert r.returncode != 0 and "install_extra_packages: got 2 item(s), 1 of them not name==version" in \
        flat(r.stdout + r.stderr), r.stdout + r.stderr
    assert (main_pid(H), sh(H, "readlink /opt/deployer/current"), sh(H, "ls /opt/deployer/releases")) == before


def test_03_warm_compile_cache_prewarm_before_the_stop_and_downtime():
    first = manifest()
    # guards: the compile cache is the service user's, shared by releases: the first start of a config
    # compiles (miss), a later start of the same config loads from the cache (hit)
    assert first["compile_cache"] == "miss", first
    assert sh(H, "stat -c %U /opt/deployer/cache/server/vllm/torch_compile_cache") == "vllm"
    # the sandbox's checkpoint is ~595 GB (sparse) as on a real host: too big to prewarm here; this release serves
    # the same config from 16-byte shards, which a laptop can read whole
    r = up("-e", "deployer_max_model_len=65536", "-e", f"deployer_model_dir={SMALL_MODEL_DIR}", *FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    second = manifest()
    assert "prewarm" in flat(r.stderr) and "read 0.0 GiB" in flat(r.stderr), r.stderr
    # guards: the prewarm ran while the old server still served, and the downtime runs from the old
    # server's last answer to the new one's first
    pw, down = second["prewarm"], second["downtime"]
    assert pw["state"] == "done" and pw["done_bytes"] == pw["total_bytes"] > 1 << 20, pw   # 64 shards + drafter
    assert pw["finished_at"] < down["old_last_ok_at"] < down["new_first_ok_at"], (pw, down)
    assert down["seconds"] == pytest.approx(down["new_first_ok_at"] - down["old_last_ok_at"], abs=0.1)
    assert 0 < down["seconds"] < second["load_seconds"] + 15, (down, second["load_seconds"])

    # the rollback restarts the first config: a cache hit; a prewarm that cannot fit is skipped and says why
    r = deployer("rollback", "--sandbox", "-e", "prewarm_reserve_gib=100000")
    assert r.returncode == 0, r.stdout + r.stderr
    back = manifest()
    assert back["id"] == first["id"] and back["compile_cache"] == "hit", back
    assert back["prewarm"]["state"] == "skipped" and "MemAvailable" in back["prewarm"]["note"], back["prewarm"]
    assert "skipped: the files take" in flat(r.stderr), r.stderr
    assert back["downtime"]["seconds"] > 0, back["downtime"]
    # every number is shown: releases has a downtime, load, prewarm and compile column; status the parts
    r = deployer("releases", "--sandbox")
    rows = {m.group(0): line for line in r.stdout.splitlines() if (m := re.search(r"\b[0-9a-f]{12}\b", line))}
    assert "hit" in rows[first["id"]] and "skip" in rows[first["id"]], r.stdout
    assert str(back["downtime"]["seconds"]) in rows[first["id"]], r.stdout
    r = deployer("status", "--sandbox")
    assert f"downtime {back['downtime']['seconds']} s" in flat(r.stdout) and "loading weights" in r.stdout, r.stdout


def test_04_disk_preflight_asks_only_for_what_is_missing():
    # guards: a venv that is already installed is not asked for again (a no-op needs only the margin)
    r = up("-e", "preflight_venv_disk_gib=100000")
    assert r.returncode == 0, r.stdout + r.stderr
    # a new vLLM version needs its venv: refused, naming each part of the sum
    r = up("--check", "-e", "deployer_vllm_version=0.18.0", "-e", "preflight_venv_disk_gib=100000")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "free disk on the filesystem of /opt/deployer and /opt/deployer/venvs: measured" in flat(r.stderr), r.stderr
    assert "expected >= 100005.0 GiB (venv 100000.0 GiB + margin 5.0 GiB; in bytes" in flat(r.stderr), r.stderr


def test_04b_a_disk_that_fills_up_during_the_drafter_copy_gets_its_space_back(tmp_path):
    """Issue #12, disk full.  The drafter store is a small filesystem of its own (a tmpfs over
    /opt/deployer/drafters holding the live drafter).  Guards: the preflight measures THAT filesystem (the deploy
    root's big disk does not hide its shortage); a copy that runs out of space anyway (the preflight counts bytes,
    the filesystem allocates pages) fails naming the path and the bytes, removes its partial copy (space given
    back) and touches nothing the live release uses."""
    import shutil

    from deployer.sandbox import checkpoints
    from deployer.sandbox import hosts as sb
    src = tmp_path / "drafter"
    shutil.copytree(sb.STATE / "drafter", src)
    # another drafter (a header-true safetensors file: the drafter check reads it), not page-aligned
    (src / "model.safetensors").write_bytes(
        checkpoints.drafter_weights_bytes(checkpoints.drafter_tensors(), (1 << 20) + 100))
    need = sum(f.stat().st_size for f in src.iterdir())
    new = ["-e", f"deployer_drafter_src_dir={src}", "-e", "preflight_disk_margin_gib=0", *FAST]
    assert up(*FAST).returncode == 0
    before = (sh(H, f"systemctl show -p InvocationID --value {SVC}"), sh(H, "readlink /opt/deployer/current"))
    sh(H, "cp -a /opt/deployer/drafters /root/drafters.keep && mount -t tmpfs -o size=64m,mode=0755 tmpfs "
          "/opt/deployer/drafters && cp -a /root/drafters.keep/. /opt/deployer/drafters/")

    def used():
        return int(sh(H, "df -B1 --output=used /opt/deployer/drafters | tail -1"))
    try:
        base = used()
        # room for the new drafter's bytes rounded up to whole pages: enough for the byte count, one page short
        sh(H, f"mount -o remount,size={base + -(-need // 4096) * 4096} /opt/deployer/drafters")
        r = up(*new)
        assert r.returncode == 1, r.stdout + r.stderr
        err = flat(r.stderr)
        assert (f"drafter: no space left on the filesystem of /opt/deployer/drafters while copying: the drafter "
                f"needs {need} bytes") in err, err
        assert "the partial copy /opt/deployer/drafters/.incoming-" in err and "was removed" in err, err
        assert sh(H, "ls -A /opt/deployer/drafters | grep -c '^.incoming-' || true") == "0" and used() == base
        # a store too small for the byte count is refused before anything is written, naming that filesystem
        sh(H, f"mount -o remount,size={base + 4096} /opt/deployer/drafters")
        r = up(*new)
        assert r.returncode == 3, r.stdout + r.stderr
        assert "free disk on the filesystem of /opt/deployer/drafters: measured 0.0 MiB, expected >= 1.0 MiB " \
               f"(drafter 1.0 MiB + margin 0.0 GiB; in bytes 4096 < {need})" in flat(r.stderr), r.stderr
        # the live release never noticed
        assert (sh(H, f"systemctl show -p InvocationID --value {SVC}"), sh(H, "readlink /opt/deployer/current")) \
            == before
        assert sh(H, "curl -s -o /dev/null -w '%{http_code}' localhost:8000/health") == "200"
    finally:
        sh(H, "umount -l /opt/deployer/drafters; rm -rf /root/drafters.keep", check=False)


def test_04c_a_disk_that_fills_up_during_the_install_gets_its_space_back():
    """Issue #12, disk full during the install.  /opt/deployer/venvs is a small filesystem of its own (a tmpfs; the
    live venv stays visible in it through a bind mount).  The preflight is told the new venv needs little
    (``preflight_venv_disk_gib``: as if it had counted wrong, or something else filled the disk on the way), so
    uv runs out of space.  Guards: the failure names the filesystem and what is free; the half-installed venv is
    removed at once (space given back, never used); the live release keeps serving, not restarted."""
    assert up(*FAST).returncode == 0
    live = venv()
    name = live.rsplit("/", 1)[1]
    before = (sh(H, f"systemctl show -p InvocationID --value {SVC}"), sh(H, "readlink /opt/deployer/current"))
    sh(H, "mkdir -p /root/venvs.real && mount --bind /opt/deployer/venvs /root/venvs.real && "
          "mount -t tmpfs -o size=48m,mode=0755 tmpfs /opt/deployer/venvs && "
          f"mkdir /opt/deployer/venvs/{name} && mount --bind /root/venvs.real/{name} /opt/deployer/venvs/{name}")
    try:
        free = int(sh(H, "df -B1 --output=avail /opt/deployer/venvs | tail -1"))
        r = up("-e", "deployer_vllm_version=0.18.0", "-e", "preflight_venv_disk_gib=0", *FAST)
        assert r.returncode == 1, r.stdout + r.stderr
        err = flat(r.stderr)
        assert ("install: no space left on the filesystem of /opt/deployer/venvs while installing vllm==0.18.0 "
                "(more than the preflight asked for there in its venv disk setting, or something else filled "
                "it);") in err, err
        assert re.search(r"\d+ bytes are free now; the partial venv /opt/deployer/venvs/vllm-0\.18\.0\S* was removed "
                         r"and nothing uses it", err), err
        assert sh(H, "ls /opt/deployer/venvs") == name                               # nothing half-done left
        assert int(sh(H, "df -B1 --output=avail /opt/deployer/venvs | tail -1")) == free   # space given back
        assert (sh(H, f"systemctl show -p InvocationID --value {SVC}"), sh(H, "readlink /opt/deployer/current")) \
            == before
        assert sh(H, "curl -s -o /dev/null -w '%{http_code}' localhost:8000/health") == "200"
    finally:
        sh(H, f"umount /opt/deployer/venvs/{name}; umount -l /opt/deployer/venvs; umount /root/venvs.real; "
              "rmdir /root/venvs.real", check=False)
    assert sh(H, f"test -f {live}/.deployer-installed && echo ok") == "ok"


def test_05_unused_venvs_and_drafters_are_collected_with_the_releases():
    live_venv = manifest()["venv"]
    assert live_venv == venv()
    # what a pruned release or an older patch engine left behind, and an interrupted removal
    sh(H, "mkdir -p /opt/deployer/venvs/vllm-0.15.1-p00000000/bin /opt/deployer/venvs/.trash-vllm-x "
          "/opt/deployer/drafters/00000000deadbeef && touch /opt/deployer/venvs/vllm-0.15.1-p00000000/"
          ".deployer-installed")
    r = up("-e", "deployer_max_model_len=32768", *FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    left = sh(H, "ls -A /opt/deployer/venvs /opt/deployer/drafters")
    # guards: venvs and drafters no kept release uses are removed; the ones releases use stay
    assert "vllm-0.15.1-p00000000" not in left and ".trash-vllm-x" not in left and "00000000deadbeef" not in left
    assert live_venv.rsplit("/", 1)[1] in left and manifest()["drafter_dir"].rsplit("/", 1)[1] in left


def events(r):
    return [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]


def test_06_noop_reads_the_host_once_and_still_proves_the_truth():
    r = up("--json")     # the defaults become live again (test_05 left another release live)
    assert r.returncode == 0 and events(r)[-1]["hosts"][H]["noop_reasons"], r.stdout + r.stderr
    pid = main_pid(H)
    lines = int(sh(H, "wc -l < /opt/deployer/audit.jsonl"))
    r = up("--json")
    assert r.returncode == 0, r.stdout + r.stderr
    result = events(r)[-1]["hosts"][H]
    # guards: nothing to do is decided from one probe; no stage runs, nothing restarts, one audit line
    assert result["noop_checked"] is True and result["release_was_live"] is True and not result["restarted"], result
    assert not [e for e in events(r) if e.get("event") == "stage"], r.stdout
    assert main_pid(H) == pid and int(sh(H, "wc -l < /opt/deployer/audit.jsonl")) == lines + 1
    assert json.loads(sh(H, "tail -1 /opt/deployer/audit.jsonl"))["changed"] is False
    # a live file edited by hand is not trusted: the full deploy runs and puts it right
    sh(H, "echo 'VLLM_LOGGING_LEVEL=DEBUG' >> /opt/deployer/current/vllm.env")
    r = up("--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert events(r)[-1]["hosts"][H]["noop_reasons"] == ["the live environment file differs from the planned one"]
    assert "VLLM_LOGGING_LEVEL" not in sh(H, "cat /opt/deployer/current/vllm.env")
    # a server that is down is not a no-op either
    sh(H, f"systemctl stop {SVC}")
    r = up()
    assert r.returncode == 0 and sh(H, f"systemctl is-active {SVC}") == "active", r.stdout + r.stderr


def flip_byte(path, offset):
    """Change one byte of a file on the host in place (size kept) to a value it surely did not have: the sandbox
    drafter's data is random, so writing a fixed byte left the file as it was once in 256 slots (slot 0's byte 4096
    was 'X' and stayed so across runs: CI failed on it)."""
    old = int(sh(H, f"od -An -tu1 -j{offset} -N1 {path}"))
    sh(H, f"printf '\\{(old ^ 0xFF):03o}' | dd of={path} bs=1 seek={offset} conv=notrunc status=none")
    assert int(sh(H, f"od -An -tu1 -j{offset} -N1 {path}")) == old ^ 0xFF


def test_06b_tampering_on_the_host_is_found_and_repaired_or_refused():
    """Guards (issue #12, tampering and rot): a drafter file changed after shipping is seen by the no-op (size and
    mtime, no hashing) and re-shipped by checksum without a restart; rot that keeps size and mtime is caught by the
    checksum of the next deploy that is not a no-op; an edited argv.json of the live release is not trusted by the
    no-op and is rendered again; a rollback target edited by hand is refused, not started as it is."""
    assert up().returncode == 0
    pid = main_pid(H)
    d = json.loads(sh(H, "cat /opt/deployer/current/release.json"))["drafter_dir"]
    f = f"{d}/model.safetensors"
    good = sh(H, f"sha256sum {f}").split()[0]
    flip_byte(f, 4096)
    r = up("--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ("the drafter changed on the host after it was shipped: model.safetensors (modified after it was shipped)"
            in events(r)[-1]["hosts"][H]["noop_reasons"]), r.stdout
    assert f"drafter {d}: model.safetensors differ from the sha256 it was shipped with" in flat(r.stdout), r.stdout
    assert sh(H, f"sha256sum {f}").split()[0] == good and main_pid(H) == pid       # repaired, not restarted
    r = up("--json")
    assert r.returncode == 0 and events(r)[-1]["hosts"][H]["noop_checked"], r.stdout + r.stderr   # a no-op again
    # rot that keeps the size and the mtime: the no-op does not hash (by design); the next real deploy does
    sh(H, f"cp -p {f} /root/keep")
    flip_byte(f, 8)
    sh(H, f"touch -r /root/keep {f}")
    r = up("-e", "deployer_gpu_memory_utilization=0.9574", *FAST)     # vLLM's checks are not what this is about
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"drafter {d}: model.safetensors differ from the sha256" in flat(r.stderr), r.stderr
    assert sh(H, f"sha256sum {f}").split()[0] == good
    # the live release's argv.json edited by hand: named by the no-op, rendered again by the deploy
    sh(H, "sed -i 's/0.9574/0.99/' /opt/deployer/current/argv.json")
    r = up("--json", "-e", "deployer_gpu_memory_utilization=0.9574", *FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ("the live release's files were edited after they were rendered: argv.json"
            in events(r)[-1]["hosts"][H]["noop_reasons"]), r.stdout
    assert "0.99" not in sh(H, "cat /opt/deployer/current/argv.json")
    assert sh(H, "cd /opt/deployer/current && sha256sum --quiet -c .deployer-sha256sums && echo intact") == "intact"
    # a rollback target whose unit was edited by hand is refused, naming the file; nothing restarts
    prev, pid = sh(H, "readlink /opt/deployer/previous"), main_pid(H)
    sh(H, f"echo '# edited' >> {prev}/{SVC}.service")
    try:
        r = deployer("rollback", "--sandbox")
    finally:
        sh(H, f"sed -i '$d' {prev}/{SVC}.service")
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"was changed on the host after it was deployed ({SVC}.service)" in flat(r.stderr), r.stderr
    assert main_pid(H) == pid


def test_07_a_verified_launch_is_not_verified_again():
    r = up("-e", "deployer_max_model_len=16384")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "accepts this launch" in flat(r.stderr) and "cached" not in flat(r.stderr), r.stderr
    # guards: what vLLM's model registry learnt in the venv's first checks (test_01) is handed to these: vLLM
    # inspected the Kimi class again in two subprocesses of its own, re-importing vLLM and torch (~20 CPU-s), each run
    report = json.loads(sh(H, "cat $(ls -t /opt/deployer/cache/verify/[0-9a-f]*.json | head -1)"))
    assert "vllm-model_executor-models-kimi_k25-KimiK25ForConditionalGeneration.json" \
        in report["engine_cache"]["seeded"] and report["engine_cache"]["changed"] is False, report["engine_cache"]
    assert deployer("rollback", "--sandbox").returncode == 0
    # guards: the same launch on the same code reuses vLLM's verdict (keyed by argv, patch fingerprint,
    # vLLM version, model config, platform, verifier); a different launch is verified afresh
    r = up("-e", "deployer_max_model_len=16384")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cached: this launch passed on" in flat(r.stderr), r.stderr
    names = sh(H, "ls /opt/deployer/cache/verify").split()
    keys = [n for n in names if not n.startswith("engine-cache-")]
    assert keys and all(re.fullmatch(r"[0-9a-f]{64}\.json", k) for k in keys), names
    assert [n for n in names if n not in keys] == [f"engine-cache-{venv().rsplit('/', 1)[1]}.json"], names


def test_08_misspelt_settings_are_refused_with_a_did_you_mean():
    import yaml

    from deployer.sandbox import hosts as sb
    # -e: refused by the CLI before any SSH
    r = up("-e", "deployer_max_modl_len=4096")
    assert r.returncode == 2 and "did you mean deployer_max_model_len?" in flat(r.stderr), r.stderr
    # group_vars (here: the inventory's group vars): refused by preflight, nothing changed, no no-op shortcut
    inv = yaml.safe_load((sb.STATE / "inventory.yml").read_text())
    inv["all"]["children"]["gpu"]["vars"]["deployer_gpu_memory_utilisation"] = 0.5
    path = sb.STATE / "typo-inventory.yml"
    path.write_text(yaml.safe_dump(inv))
    before = (main_pid(H), sh(H, "readlink /opt/deployer/current"))
    r = deployer("up", "-i", str(path))
    assert r.returncode == 3, r.stdout + r.stderr
    assert "unknown setting: deployer_gpu_memory_utilisation (did you mean deployer_gpu_memory_utilization?)" \
        in flat(r.stderr), r.stderr
    assert (main_pid(H), sh(H, "readlink /opt/deployer/current")) == before


def test_09_secrets_appear_nowhere_but_the_0600_env_file():
    import os

    from helpers import ROOT
    key, token = "sekritKEY-9f8e7d", "hf_sekritTOKEN42"
    env = dict(os.environ, DEPLOYER_API_KEY=key, DEPLOYER_HF_TOKEN=token)
    outs = []
    since = sh(H, "date +%s")    # every file written from here on is searched, whatever its directory
    r = up("-vvv", "--diff", "-e", "deployer_max_model_len=16384", *FAST, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    outs.append(r.stdout + r.stderr)
    r = up("--json", "-vvv", "--diff", "-e", "deployer_max_model_len=8192", *FAST, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    outs.append(r.stdout + r.stderr)
    # a failure after the restart (smoke refuses, rollback) prints the failing tasks: still no secret
    r = up("-vvv", "-e", "deployer_max_model_len=4096", "-e", "smoke_min_acceptance_rate=0.99", *FAST, env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    outs.append(r.stdout + r.stderr)
    # guards: no output of any kind carries the key or the token
    for o in outs:
        assert key not in o and token not in o
    # on the host: only the releases' env files hold them, root's and 0600; not the process list, not the
    # journal, not the audit log or a manifest
    # (the repository is bind-mounted into sandbox hosts under its own path: its test files are not the host's)
    # (searching only what changed since the test began: grepping whole vLLM venvs took > 60 s on CI;
    # the files a deploy writes, venv included, are all newer than `since`)
    files = sh(H, f"find /opt/deployer /etc /var/log /run /tmp -path {ROOT} -prune -o -type f "
                  f"-newermt @{int(since) - 1} -print0 2>/dev/null "
                  f"| xargs -0 -r grep -lF -e {key} -e {token} 2>/dev/null "
                  "| xargs -r stat -c '%a %U %n'").splitlines()
    # (issue 20, item 8: the live secrets dir, never a release)
    assert files and set(files) <= {"600 root /opt/deployer/secrets/server.env",
                                    "600 root /opt/deployer/secrets/sglang-secrets.yaml"}, files
    # guards (issue 20, item 10): no unsalted hash of the secrets in verbose output either (release_inputs.secrets
    # was sha256 of key NUL token, printed by -v)
    import hashlib
    for digest in (hashlib.sha256(f"{key}\0{token}".encode()).hexdigest(), hashlib.sha256(key.encode()).hexdigest()):
        assert all(digest not in o and digest[:12] not in o for o in outs)
    pattern = key[:6] + "[" + key[6] + "]" + key[7:]    # so that this command does not match itself
    assert sh(H, f"ps -eo args | grep -c '{pattern}' || true") == "0"
    assert sh(H, f"journalctl --no-pager | grep -c '{pattern}' || true") == "0"


def test_10_the_service_user_cannot_make_root_chown_or_run_anything_for_it():
    # guards (issue 20, item 1): the service user owns its home (the server cache) and replaced `triton` with a
    # symlink to /etc/systemd/system; the next deploy's `file state=directory owner=vllm` followed it, made root
    # chown that directory to the service user, who could then plant a drop-in the deploy's daemon-reload ran
    as_vllm = "runuser -u vllm -- sh -c "
    sh(H, as_vllm + "'cd /opt/deployer/cache/server && rm -rf triton xdg && ln -s /etc/systemd/system triton "
                    "&& ln -s /etc xdg'")
    assert sh(H, "readlink /opt/deployer/cache/server/triton") == "/etc/systemd/system"
    r = up("-e", "deployer_max_model_len=12288")           # a new release: the whole path, install stage included
    assert r.returncode == 0, r.stdout + r.stderr
    assert sh(H, "stat -c '%U:%G' /etc/systemd/system /etc") == "root:root\nroot:root"
    for d in ("triton", "xdg"):
        assert sh(H, f"stat -c '%F %U %a' /opt/deployer/cache/server/{d}") == "directory vllm 750", d
    assert "replaced what the service user could have planted" in flat(r.stdout + r.stderr) or \
        sh(H, "test -L /opt/deployer/cache/server/triton && echo link || echo dir") == "dir"
    # guards: vLLM's own checks (they run the model's config code: --trust-remote-code) ran in a sandboxed transient
    # unit, never as root, and (issue 53 N2) not as the live server's user either: a user of their own for the run
    reports = sh(H, "cat /opt/deployer/cache/verify/[0-9a-f]*.json")
    assert '"ran_as": {"uid": ' in reports and '"user": "deployer-verify"' in reports, reports[-2000:]
    assert '"user": "root"' not in reports and '"user": "vllm"' not in reports
    assert sh(H, "stat -c '%a' $(ls -t /opt/deployer/cache/verify/[0-9a-f]*.json | head -1)") == "600"


# a checkpoint whose config code reads every process's environment it can open into its error (issue 53 N2)
_HOSTILE_CONFIG = """
import glob
found = []
for p in glob.glob("/proc/[0-9]*/environ"):
    try:
        found.append(open(p, "rb").read().replace(b"\\0", b" ").decode("latin-1"))
    except OSError as e:
        found.append(type(e).__name__)
raise ValueError("ENVIRON-DUMP " + " | ".join(found))
"""


def test_10b_the_checks_of_a_new_checkpoint_cannot_read_the_live_servers_secrets():
    from deployer.sandbox import inventory
    from deployer.sandbox.common import SMALL_MODEL_DIR
    key = inventory.api_key()
    pid = main_pid(H)
    assert key in sh(H, f"tr '\\0' ' ' < /proc/{pid}/environ")       # the live server holds it (root sees it)
    evil = "/srv/models/evil-config"
    sh(H, f"rm -rf {evil} && cp -r {SMALL_MODEL_DIR} {evil} && cd {evil} && python3 -c '"
          "import json; c = json.load(open(\"config.json\")); c[\"model_type\"] = \"evil_probe\"; "
          "c[\"auto_map\"] = {\"AutoConfig\": \"configuration_evil.EvilConfig\"}; "
          "json.dump(c, open(\"config.json\", \"w\"))'")
    sh(H, f"cat > {evil}/configuration_evil.py <<'EOF'\n{_HOSTILE_CONFIG}\nEOF\nchmod -R a+rX {evil}")
    r = up("--json", "-e", f"deployer_model_dir={evil}", "-e", "deployer_max_model_len=10240")
    assert r.returncode == 4, r.stdout[-3000:] + r.stderr[-3000:]
    assert "ENVIRON-DUMP" in r.stdout + r.stderr, r.stdout[-3000:]       # its code ran, and its error came back
    assert key not in r.stdout + r.stderr           # --json is what a schedule's webhook is sent
    assert main_pid(H) == pid                        # refused before any restart
    # what root wrote for the checks and the releases (not the uv cache's gigabytes of wheels)
    assert sh(H, f"grep -rlF {key} /opt/deployer/cache/verify /opt/deployer/releases /opt/deployer/bin "
                 "2>/dev/null || true") == ""


def test_11_a_rollback_keeps_the_live_secrets():
    # guards (issue 20, item 8): secrets were part of each release (its env file and its id), so a rollback put a
    # rotated-away API key back in service and every kept release kept its old token on disk
    from deployer.sandbox import inventory
    old, new = "old-key-" + "7" * 12, "rotated-key-" + "3" * 12
    r = up("-e", f"deployer_api_key={old}", "-e", "deployer_max_model_len=6144", *FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    first = manifest()["id"]
    # the same release with a rotated key: found by the no-op check, written, the server restarted; same id
    pid = main_pid(H)
    r = up("-e", f"deployer_api_key={new}", "-e", "deployer_max_model_len=6144", *FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    assert manifest()["id"] == first and main_pid(H) != pid
    r = up("-e", f"deployer_api_key={new}", "-e", "deployer_max_model_len=5120", *FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    r = deployer("rollback", "--sandbox", "--to", first)
    assert r.returncode == 0, r.stdout + r.stderr
    assert manifest()["id"] == first

    def status(k):
        return sh(H, f"curl -s -o /dev/null -w '%{{http_code}}' -H 'Authorization: Bearer {k}' "
                     "http://127.0.0.1:8000/v1/models")
    assert status(new) == "200" and status(old) == "401"
    assert sh(H, f"grep -rlF {old} /opt/deployer/releases /opt/deployer/secrets /opt/deployer/current "
                 "/etc/systemd/system 2>/dev/null || true") == ""
    # back to the sandbox's own key for the tests after this one
    r = up("-e", "deployer_max_model_len=5120", *FAST)
    assert r.returncode == 0 and status(inventory.api_key()) == "200", r.stdout + r.stderr


def test_12_a_drafter_that_does_not_fit_is_refused_before_the_restart(tmp_path):
    # guards (issue 21): a drafter whose fc does not take (captured layers x target hidden) inputs passed every
    # check and /health, then killed the engine on the first request: a full load, then a rollback's second one
    from deployer.sandbox.checkpoints import write_drafter_dir
    bad = write_drafter_dir(tmp_path / "drafter-2-layers", fc_in=2 * 7168)
    before = (main_pid(H), sh(H, "readlink /opt/deployer/current"))
    r = up("-e", f"deployer_drafter_src_dir={bad}", "-e", "deployer_max_model_len=7168")
    assert r.returncode == 3, r.stdout + r.stderr
    err = flat(r.stderr)
    assert "fc.weight takes 14336 inputs" in err and "target layers [2, 30, 58]" in err, err
    assert "hidden size 7168" in err and "expected 3 x 7168 = 21504" in err, err
    assert (main_pid(H), sh(H, "readlink /opt/deployer/current")) == before


def test_13_a_line_end_or_a_managed_flag_in_any_spelling_is_refused_before_anything_restarts():
    # guards (issue 20, items 2 and 3): "x\rUser=root" was installed and cut the unit's ExecStart at the restart;
    # "--ho 0.0.0.0" (argparse's --host) opened a loopback deploy to every interface
    before = (main_pid(H), sh(H, "readlink /opt/deployer/current"), sh(H, "ls /opt/deployer/releases"))
    for words, said in ((["--root-path", "/x\rUser=root"], "U+000D"), (["--ho", "0.0.0.0"], "--ho abbreviates --host"),
                        (["--speculative-config.model", "/tmp/x"], "sets --speculative-config")):
        r = up("-e", json.dumps({"deployer_extra_args": words}))
        assert r.returncode == 3 and said in flat(r.stderr), (words, r.stdout + r.stderr)
    assert (main_pid(H), sh(H, "readlink /opt/deployer/current"), sh(H, "ls /opt/deployer/releases")) == before
    # guards (issue 23, sm_120): an attention backend the GPUs cannot run is refused by the installed vLLM's own
    # backend class for the compute capability preflight measured (12.0 here), before the restart; vLLM itself
    # checks it only when it selects the backend on the GPU, after the restart and minutes of loading
    r = up("-e", json.dumps({"deployer_extra_args": ["--attention-backend", "FLASHMLA"]}))
    assert r.returncode == 4, r.stdout + r.stderr
    assert "[attention_backend] RuntimeError: attention backend FLASHMLA does not run on compute capability 12.0" \
        in flat(r.stderr), r.stderr
    assert (main_pid(H), sh(H, "readlink /opt/deployer/current")) == before[:2]
