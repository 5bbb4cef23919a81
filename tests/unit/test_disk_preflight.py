"""The disk preflight's arithmetic (filter disk_shortfalls): each filesystem written to must hold what is written
there plus the margin; needs on one filesystem add up; nothing to write asks for nothing; the message names the
path(s), the measured and the expected bytes, and each part of the sum."""
from deployer.ansible_plugins.filter_plugins.deployer_filters import disk_shortfalls

GIB = 1 << 30


def needs(venv=0, drafter=0):
    return [{"what": "venv", "path": "/opt/deployer/venvs", "bytes": venv},
            {"what": "drafter", "path": "/opt/deployer/drafters", "bytes": drafter}]


def test_one_filesystem_adds_up_venv_drafter_and_margin():
    free_kib = (12 + 1 + 5) * GIB // 1024
    same = [f"2049 {free_kib} /opt/deployer", f"2049 {free_kib} /opt/deployer"]
    assert disk_shortfalls(same, needs(12 * GIB, 1 * GIB), 5) == []
    short = disk_shortfalls(same, needs(12 * GIB, 1 * GIB + 1), 5)
    assert short == ["free disk on the filesystem of /opt/deployer/venvs and /opt/deployer/drafters: measured "
                     f"18.0 GiB ({18 * GIB} bytes), expected >= 18.0 GiB ({18 * GIB + 1} bytes: venv 12.0 GiB + "
                     "drafter 1.0 GiB + margin 5.0 GiB)"]


def test_each_filesystem_is_asked_only_for_what_goes_there():
    # the drafter store is a small filesystem of its own: the venv's big disk does not hide its shortage
    measured = [f"2049 {100 * GIB // 1024} /opt/deployer", "51 1024 /opt/deployer/drafters"]
    short = disk_shortfalls(measured, needs(12 * GIB, 2 * 1024 * 1024), 0)
    assert short == ["free disk on the filesystem of /opt/deployer/drafters: measured 1.0 MiB (1048576 bytes), "
                     "expected >= 2.0 MiB (2097152 bytes: drafter 2.0 MiB + margin 0.0 GiB)"]


def test_nothing_to_write_asks_for_nothing():
    full = ["2049 0 /opt/deployer", "2049 0 /opt/deployer"]
    assert disk_shortfalls(full, needs(0, 0), 5) == []
