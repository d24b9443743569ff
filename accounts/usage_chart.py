"""The usage admin's chart: tokens per UTC day per plan over the last days, as SVG geometry.

Read from the UsageRecord ledger itself (not the UsageDay roll-up, which only Celery beat
keeps current), grouped by each user's plan today (a user without an account yet is on the default plan, as
accounts.services.account_for would make it). The template draws the bars; no script.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db.models import F, Sum, Value
from django.db.models.functions import Coalesce, TruncDate
from django.utils import timezone

from accounts.models import DEFAULT_PLAN, UsageRecord

DAYS = 30
# Tell plans apart on light and dark admin themes alike; a ninth plan reuses the first colour.
COLOURS = ["#2563eb", "#f59e0b", "#10b981", "#ef4444", "#8b5cf6", "#06b6d4", "#ec4899", "#84cc16"]
WIDTH, HEIGHT = 760, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 8, 12, 28  # room for the axis labels


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    colour: str
    label: str  # what a pointer over the bar shows


@dataclass(frozen=True)
class Tick:
    y: float
    label: str


@dataclass(frozen=True)
class DayLabel:
    x: float
    label: str


@dataclass(frozen=True)
class UsageChart:
    plans: list[tuple[str, str]]  # (plan, colour), the legend
    bars: list[Bar]
    ticks: list[Tick]
    day_labels: list[DayLabel]
    total: int
    first_day: dt.date
    last_day: dt.date
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    baseline: int = HEIGHT - BOTTOM


def tokens_per_day_per_plan(*, days: int = DAYS, today: dt.date | None = None) -> dict[tuple[dt.date, str], int]:
    """Prompt + completion tokens per (UTC day, plan name) over the `days` days up to today."""
    today = today or timezone.now().astimezone(dt.UTC).date()
    since = dt.datetime.combine(today - dt.timedelta(days=days - 1), dt.time(), tzinfo=dt.UTC)
    rows = (
        UsageRecord.objects.filter(created_at__gte=since)
        .annotate(
            day=TruncDate("created_at", tzinfo=dt.UTC), plan=Coalesce("user__account__plan__name", Value(DEFAULT_PLAN))
        )
        .values("day", "plan")
        .annotate(tokens=Sum(F("prompt_tokens") + F("completion_tokens")))
    )
    return {(row["day"], row["plan"]): row["tokens"] or 0 for row in rows}


def usage_chart(*, days: int = DAYS, today: dt.date | None = None) -> UsageChart:
    """Stacked bars, one per day (oldest on the left), one colour per plan."""
    today = today or timezone.now().astimezone(dt.UTC).date()
    tokens = tokens_per_day_per_plan(days=days, today=today)
    plans = sorted({plan for _day, plan in tokens})
    colours = {plan: COLOURS[index % len(COLOURS)] for index, plan in enumerate(plans)}
    all_days = [today - dt.timedelta(days=offset) for offset in range(days - 1, -1, -1)]
    day_totals = {day: sum(tokens.get((day, plan), 0) for plan in plans) for day in all_days}
    top = _round_up(max(day_totals.values(), default=0))
    plot_height = HEIGHT - TOP - BOTTOM
    slot = (WIDTH - LEFT - RIGHT) / days
    bars: list[Bar] = []
    for index, day in enumerate(all_days):
        stacked = 0
        for plan in plans:
            value = tokens.get((day, plan), 0)
            if not value:
                continue
            height = value / top * plot_height
            y = HEIGHT - BOTTOM - (stacked + value) / top * plot_height
            label = f"{day:%Y-%m-%d} · {plan}: {value:,} tokens"
            bars.append(Bar(LEFT + index * slot + slot * 0.15, y, slot * 0.7, height, colours[plan], label))
            stacked += value
    ticks = [Tick(HEIGHT - BOTTOM - share * plot_height, f"{round(top * share):,}") for share in (0, 0.5, 1)]
    # A date under every 7th bar, counted back from today.
    day_labels = [
        DayLabel(LEFT + index * slot + slot / 2, f"{day:%m-%d}")
        for index, day in enumerate(all_days)
        if (days - 1 - index) % 7 == 0
    ]
    return UsageChart(
        plans=[(plan, colours[plan]) for plan in plans],
        bars=bars,
        ticks=ticks,
        day_labels=day_labels,
        total=sum(day_totals.values()),
        first_day=all_days[0],
        last_day=today,
    )


def _round_up(value: int) -> int:
    """The axis' top: 1, 2 or 5 times a power of ten, at least `value` (and at least 10)."""
    magnitude = 10
    while True:
        for factor in (1, 2, 5):
            if magnitude * factor >= value:
                return magnitude * factor
        magnitude *= 10
