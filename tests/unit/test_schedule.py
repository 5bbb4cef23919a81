from datetime import datetime

import pytest

from deployer.schedule import Schedule, ScheduleError, cron_line, in_window, on_calendar, parse_at


def test_parse_at():
    assert parse_at("Sun 03:00") == (["sun"], 3, 0)
    assert parse_at("Mon,Thu 02:30") == (["mon", "thu"], 2, 30)
    assert parse_at("daily 03:00") == ([], 3, 0) == parse_at("03:00")
    for bad in ("Sunday 3", "Xyz 03:00", "25:00", ""):
        with pytest.raises(ScheduleError):
            parse_at(bad)


def test_cron_and_timer():
    s = Schedule(id="abc", at="Mon,Thu 02:30", target=["--sandbox"])
    line = cron_line(s, "/opt/x/deployer")
    assert line.startswith("30 2 * * 1,4 /usr/bin/env PATH=") and line.endswith("# deployer-schedule:abc")
    assert "/opt/x/deployer schedule run abc >> " in line
    assert on_calendar(s) == "Mon,Thu *-*-* 02:30:00"


def test_windows_including_midnight_wrap():
    at = lambda h, m: datetime(2026, 11, 29, h, m)
    assert in_window(None, at(12, 0))
    assert in_window("02:00-05:00", at(3, 0)) and not in_window("02:00-05:00", at(5, 0))
    assert in_window("23:00-01:00", at(23, 30)) and in_window("23:00-01:00", at(0, 30))
    assert not in_window("23:00-01:00", at(12, 0))
