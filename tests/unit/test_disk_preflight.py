"""The disk preflight's arithmetic (filter disk_shortfalls): each filesystem written to must hold what is written
there plus the margin; needs on one filesystem add up; the deploy root's filesystem always keeps the margin (journals
and caches grow on every restart), other filesystems are asked only for what goes there; the message names the
path(s), the measured and the expected value (GiB, then bytes) and each part of the sum."""
from deployer.ansible_plugins.filter_plugins.deployer_filters import disk_shortfalls

GIB = 1 << 30


def needs(venv=0, drafter=0):
    return [{"what": "deploy root", "path": "/opt/deployer", "bytes": 0, "always": True},
            {"what": "venv", "path": "/opt/deployer/venvs", "bytes": venv},
            {"what": "drafter", "path": "/opt/deployer/drafters", "bytes": drafter}]


def one_fs(free_bytes):
    return [f"2049 {free_bytes // 1024} /opt/deployer"] * 3


def test_one_filesystem_adds_up_venv_drafter_and_margin():
    assert disk_shortfalls(one_fs(18 * GIB), needs(12 * GIB, 1 * GIB), 5) == []
    short = disk_shortfalls(one_fs(18 * GIB), needs(12 * GIB, 1 * GIB + 1), 5)
    assert short == ["free disk on the filesystem of /opt/deployer and /opt/deployer/venvs and /opt/deployer/drafters: "
                     "measured 18.0 GiB, expected >= 18.0 GiB (venv 12.0 GiB + drafter 1.0 GiB + margin 5.0 GiB; "
                     f"in bytes {18 * GIB} < {18 * GIB + 1})"]


def test_each_filesystem_is_asked_only_for_what_goes_there():
    # the drafter store is a small filesystem of its own: the root's big disk does not hide its shortage,
    # and the root's margin is not asked of it
    measured = [f"2049 {100 * GIB // 1024} /opt/deployer"] * 2 + ["51 1024 /opt/deployer/drafters"]
    short = disk_shortfalls(measured, needs(12 * GIB, 2 * 1024 * 1024), 5)
    assert short == ["free disk on the filesystem of /opt/deployer/drafters: measured 1.0 MiB, expected >= 5.0 GiB "
                     f"(drafter 2.0 MiB + margin 5.0 GiB; in bytes 1048576 < {5 * GIB + 2 * 1024 * 1024})"]
    assert disk_shortfalls(measured, needs(12 * GIB, 512 * 1024), 0) == []


def test_the_deploy_root_keeps_its_margin_even_when_nothing_is_written():
    assert disk_shortfalls(one_fs(4 * GIB), needs(0, 0), 5) == [
        "free disk on the filesystem of /opt/deployer: measured 4.0 GiB, expected >= 5.0 GiB (margin 5.0 GiB; "
        f"in bytes {4 * GIB} < {5 * GIB})"]
    measured = [f"2049 {100 * GIB // 1024} /opt/deployer"] * 2 + ["51 0 /opt/deployer/drafters"]
    assert disk_shortfalls(measured, needs(0, 0), 5) == []            # a full store that nothing is written to
