"""Budget periods: where the one holding a moment begins and when it resets. Plain Python.

Calendar periods (day, week from Monday, month) begin at local midnight in the given time
zone, so a month in Europe/Paris begins at 23:00 or 22:00 UTC the day before, as its
people expect. A rolling window of 30 days has no calendar: it always ends now.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from zoneinfo import ZoneInfo

DAY = "day"
WEEK = "week"
MONTH = "month"
ROLLING_30_DAYS = "rolling_30d"
ROLLING_DAYS = 30
# Rolling windows are deduplicated for alerts by fixed blocks of 30 days from this day.
_BLOCKS_FROM = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Window:
    """The stretch of time a budget counts now: [start, end), and when its count resets.

    `alert_key` is the start of the period an alert is sent once for: the calendar
    period's own start, or for a rolling window the block of 30 days `now` falls in.
    """

    start: dt.datetime
    end: dt.datetime
    resets_at: dt.datetime | None
    alert_key: dt.datetime


def window_of(period: str, now: dt.datetime, zone: ZoneInfo) -> Window:
    """The window of `period` holding `now` (an aware datetime), in UTC.

    A rolling window's `resets_at` is None: what frees room in it is its oldest use
    leaving it, which the caller knows (rolling_reset).
    """
    if period == ROLLING_30_DAYS:
        start = now - dt.timedelta(days=ROLLING_DAYS)
        blocks = (now - _BLOCKS_FROM) // dt.timedelta(days=ROLLING_DAYS)
        return Window(start, now, None, _BLOCKS_FROM + blocks * dt.timedelta(days=ROLLING_DAYS))
    local = now.astimezone(zone).date()
    if period == DAY:
        first, after = local, local + dt.timedelta(days=1)
    elif period == WEEK:
        first = local - dt.timedelta(days=local.weekday())
        after = first + dt.timedelta(days=7)
    elif period == MONTH:
        first = local.replace(day=1)
        after = (first + dt.timedelta(days=32)).replace(day=1)
    else:
        raise ValueError(f"unknown budget period {period!r}")
    start, end = _midnight(first, zone), _midnight(after, zone)
    return Window(start, end, end, start)


def rolling_reset(oldest_use: dt.datetime | None, now: dt.datetime) -> dt.datetime:
    """When a rolling window first frees room: its oldest use leaves it (now, if none)."""
    if oldest_use is None:
        return now
    return oldest_use + dt.timedelta(days=ROLLING_DAYS)


def _midnight(day: dt.date, zone: ZoneInfo) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), tzinfo=zone).astimezone(dt.UTC)
