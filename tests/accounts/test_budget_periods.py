"""Budget periods (accounts.periods): plain Python, no database."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from accounts.periods import DAY, MONTH, ROLLING_30_DAYS, WEEK, window_of

PARIS = ZoneInfo("Europe/Paris")


def utc(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=dt.UTC)


def test_december_ends_at_midnight_of_new_year_in_paris():
    window = window_of(MONTH, utc(2026, 12, 31, 22, 59), PARIS)

    assert (window.start, window.end) == (utc(2026, 11, 30, 23), utc(2026, 12, 31, 23))
    assert (window.resets_at, window.alert_key) == (window.end, window.start)


def test_a_day_across_the_spring_change_of_clocks_has_23_hours():
    window = window_of(DAY, utc(2026, 3, 29, 12), PARIS)

    assert window.end - window.start == dt.timedelta(hours=23)


def test_a_week_runs_from_monday_to_monday():
    window = window_of(WEEK, utc(2026, 3, 8, 12), PARIS)  # a Sunday

    assert window.start.astimezone(PARIS).strftime("%A %d") == "Monday 02"
    assert window.end.astimezone(PARIS).strftime("%A %d") == "Monday 09"


def test_a_rolling_window_ends_now_and_alerts_once_per_block_of_30_days():
    now = utc(2026, 3, 20, 12)

    window = window_of(ROLLING_30_DAYS, now, PARIS)
    later = window_of(ROLLING_30_DAYS, now + dt.timedelta(hours=1), PARIS)

    assert (window.start, window.end, window.resets_at) == (now - dt.timedelta(days=30), now, None)
    assert window.alert_key == later.alert_key <= now < window.alert_key + dt.timedelta(days=30)


def test_an_unknown_period_is_refused():
    with pytest.raises(ValueError, match="fortnight"):
        window_of("fortnight", utc(2026, 1, 1), PARIS)
