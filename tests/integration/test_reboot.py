"""The host reboots (issue #12): after the release is live, orderly and as a power cut, and in the middle of a
load.  The sandbox host is a real systemd machine whose disk (the overlay's upper layer) survives the reboot; what
lived in memory does not.  Each test ends with the host serving the release `current` names and a converging `up`."""
import json
import subprocess
import sys
import time

import pytest

from sandbox_helpers import FAST, ROOT, SVC, deployer, health, knobs, main_pid, needs_sandbox, sandbox_hosts, sh, up

pytestmark = [pytest.mark.sandbox, needs_sandbox]
H = "sbx1"


@pytest.fixture(scope="module", autouse=True)
def sandbox():
    yield from sandbox_hosts(1, package_cache=False)   # installs nothing: no package cache to link


def events(r):
    return [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]


def wait_health(seconds=180):
    t0 = time.time()
    while time.time() - t0 < seconds:
        try:
            if health() == "200":
                return time.time() - t0
        except Exception:         # noqa: BLE001 - ssh may not answer yet right after the boot
            pass
        time.sleep(1)
    raise AssertionError(f"/health not 200 within {seconds} s; unit: "
                         + sh(H, f"systemctl status {SVC} --no-pager | head -20", check=False))


def invocation():
    return sh(H, f"systemctl show -p InvocationID --value {SVC}")


def unit_is_current():
    """The unit systemd runs is the live release's own (byte for byte)."""
    return sh(H, f"cmp -s /etc/systemd/system/{SVC}.service /opt/deployer/current/{SVC}.service && echo same",
              check=False) == "same"


@pytest.mark.parametrize("hard", [False, True], ids=["orderly", "power_cut"])
def test_after_the_release_is_live_the_server_comes_back_by_itself_and_up_is_a_noop(hard):
    r = up(*FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    live, run = sh(H, "readlink /opt/deployer/current"), invocation()
    r = deployer("sandbox", "reboot", H, *(["--hard"] if hard else []), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    # guards: the unit is enabled and names the live release; nobody runs anything: systemd starts it at boot
    # (a new run of the unit: pids repeat in a freshly booted container, systemd's invocation id does not)
    came_back = wait_health()
    assert invocation() != run and sh(H, "readlink /opt/deployer/current") == live and unit_is_current()
    st = json.loads(deployer("status", "--sandbox", "--json").stdout)[H]
    assert st["health"] == 200 and st["current"] == live.rsplit("/", 1)[1] and st["crash_loop"] is False, st
    # a rerun of up finds nothing to do: the no-op check proves it from the host (one probe, no restart)
    pid = main_pid(H)
    r = up("--json", *FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    result = events(r)[-1]["hosts"][H]
    assert result["noop_checked"] is True and not result["restarted"], result
    assert main_pid(H) == pid
    print(f"reboot ({'power cut' if hard else 'orderly'}): serving again {came_back:.1f} s after ssh answered")


def test_a_reboot_in_the_middle_of_a_load_ends_serving_what_current_names_and_the_next_up_converges():
    """A power cut while a new release loads.  Whatever the interrupted `up` concludes (its watch reconnects and
    follows the load the boot starts, or it rolls back), the host must end up serving the release `current`
    names with that release's unit, and rerunning the same `up` must end with the new release live."""
    assert up(*FAST).returncode == 0
    new = ["-e", "deployer_gpu_memory_utilization=0.9552"]
    knobs(load_seconds=25)
    try:
        p = subprocess.Popen([sys.executable, "-m", "deployer.cli", "up", "--sandbox", *new, *FAST],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        for _ in range(300):        # the new release's server is loading (its argv holds 0.9552)
            if "0.9552" in sh(H, "cat /run/deployer-standin/argv.json 2>/dev/null || true", check=False):
                break
            time.sleep(1)
        else:
            p.kill()
            raise AssertionError("the new release never started loading")
        time.sleep(3)
        r = deployer("sandbox", "reboot", H, "--hard", timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        out, err = p.communicate(timeout=900)
    finally:
        knobs()
    # whatever it concluded, it said so and left no lock behind; the host serves what `current` names
    assert p.returncode in (0, 1), out + err
    wait_health()
    assert unit_is_current(), sh(H, "readlink /opt/deployer/current")
    assert not sh(H, "ls /opt/deployer/.lock 2>/dev/null || true", check=False)
    # the same up again converges on the new release
    r = up(*new, *FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0.9552" in sh(H, "cat /opt/deployer/current/argv.json") and health() == "200" and unit_is_current()
    print(f"interrupted up exit {p.returncode}; its last lines: {err.strip().splitlines()[-3:]}")
