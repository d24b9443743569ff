"""The usage admin's charts: tokens, and spend in money, per UTC day per plan over the last
days, as SVG geometry.

Read from the UsageRecord ledger itself (not the UsageDay roll-up, which only Celery beat
keeps current), grouped by each user's plan today (a user without an account yet is on the default plan, as
accounts.services.account_for would make it). The template draws the bars; no script.
The spend is summed from the settled records' costs, exactly (Decimal), one chart per
currency; only the bars' geometry is in floats.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import TypeVar

from django.db.models import F, QuerySet, Sum, Value
from django.db.models.functions import Coalesce, TruncDate
from django.utils import timezone

from accounts.models import DEFAULT_PLAN, UsageRecord
from accounts.prices import COST_QUANTUM, cost_shown

DAYS = 30
N = TypeVar("N", int, Decimal)  # what a chart counts: tokens, or money
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
    total: int | Decimal
    first_day: dt.date
    last_day: dt.date
    title: str = "Tokens per day per plan"
    summary: str = ""  # the SVG's title: what it shows in words
    empty: str = "No tokens used in the last 30 days."
    role: str = "usage-chart"  # the figure's data-role
    element_id: str = "usage-chart"  # unique on the page
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    baseline: int = HEIGHT - BOTTOM


def tokens_per_day_per_plan(*, days: int = DAYS, today: dt.date | None = None) -> dict[tuple[dt.date, str], int]:
    """Prompt + completion tokens per (UTC day, plan name) over the `days` days up to today."""
    rows = (
        _since(days, today)
        .annotate(
            day=TruncDate("created_at", tzinfo=dt.UTC), plan=Coalesce("user__account__plan__name", Value(DEFAULT_PLAN))
        )
        .values("day", "plan")
        .annotate(tokens=Sum(F("prompt_tokens") + F("completion_tokens")))
    )
    return {(row["day"], row["plan"]): row["tokens"] or 0 for row in rows}


def spend_per_day_per_plan(
    *, currency: str, days: int = DAYS, today: dt.date | None = None
) -> dict[tuple[dt.date, str], Decimal]:
    """The settled records' costs in `currency` per (UTC day, plan name) over the `days` days
    up to today, exactly: records streaming or without a price count for nothing."""
    rows = (
        _since(days, today)
        .filter(cost__isnull=False, cost_currency=currency)
        .exclude(status=UsageRecord.Status.STREAMING)
        .annotate(
            day=TruncDate("created_at", tzinfo=dt.UTC), plan=Coalesce("user__account__plan__name", Value(DEFAULT_PLAN))
        )
        .values("day", "plan")
        .annotate(spent=Sum("cost"))
    )
    return {(row["day"], row["plan"]): row["spent"].quantize(COST_QUANTUM) for row in rows}


def usage_chart(*, days: int = DAYS, today: dt.date | None = None) -> UsageChart:
    """Stacked bars of tokens, one per day (oldest on the left), one colour per plan."""
    today = today or timezone.now().astimezone(dt.UTC).date()
    tokens = tokens_per_day_per_plan(days=days, today=today)
    chart = _stacked(
        tokens, days=days, today=today, zero=0, top=_round_up, shown=lambda value: f"{value:,}", unit="tokens"
    )
    plans = len(chart.plans)
    summary = f"{chart.total} tokens in {plans} plan{'' if plans == 1 else 's'} over the last {days} days"
    return replace(chart, summary=summary)


def spend_charts(*, days: int = DAYS, today: dt.date | None = None) -> list[UsageChart]:
    """Stacked bars of spend, one chart per currency spent in the last `days` days."""
    today = today or timezone.now().astimezone(dt.UTC).date()
    currencies = (
        _since(days, today)
        .filter(cost__isnull=False)
        .exclude(status=UsageRecord.Status.STREAMING)
        .order_by("cost_currency")
        .values_list("cost_currency", flat=True)
        .distinct()
    )
    return [spend_chart(currency=currency, days=days, today=today) for currency in currencies]


def spend_chart(*, currency: str, days: int = DAYS, today: dt.date | None = None) -> UsageChart:
    """Stacked bars of the spend in `currency`, one per day, one colour per plan."""
    today = today or timezone.now().astimezone(dt.UTC).date()
    spend = spend_per_day_per_plan(currency=currency, days=days, today=today)
    chart = _stacked(
        spend, days=days, today=today, zero=Decimal(0), top=_round_up_money, shown=cost_shown, unit=currency
    )
    return replace(
        chart,
        title=f"Spend in {currency} per day per plan",
        summary=f"{cost_shown(Decimal(chart.total))} {currency} over the last {days} days",
        empty=f"Nothing spent in {currency} in the last {days} days.",
        role="spend-chart",
        element_id=f"spend-chart-{currency.lower()}",
    )


def _since(days: int, today: dt.date | None) -> QuerySet[UsageRecord]:
    today = today or timezone.now().astimezone(dt.UTC).date()
    since = dt.datetime.combine(today - dt.timedelta(days=days - 1), dt.time(), tzinfo=dt.UTC)
    return UsageRecord.objects.filter(created_at__gte=since)


def _stacked(
    values: dict[tuple[dt.date, str], N],
    *,
    days: int,
    today: dt.date,
    zero: N,
    top: Callable[[N], N],
    shown: Callable[[N], str],
    unit: str,
) -> UsageChart:
    plans = sorted({plan for _day, plan in values})
    colours = {plan: COLOURS[index % len(COLOURS)] for index, plan in enumerate(plans)}
    all_days = [today - dt.timedelta(days=offset) for offset in range(days - 1, -1, -1)]
    day_totals = {day: sum((values.get((day, plan), zero) for plan in plans), zero) for day in all_days}
    axis_top = top(max(day_totals.values(), default=zero))
    plot_height = HEIGHT - TOP - BOTTOM
    slot = (WIDTH - LEFT - RIGHT) / days
    bars: list[Bar] = []
    for index, day in enumerate(all_days):
        stacked = zero
        for plan in plans:
            value = values.get((day, plan), zero)
            if not value:
                continue
            height = float(value / axis_top) * plot_height
            y = HEIGHT - BOTTOM - float((stacked + value) / axis_top) * plot_height
            label = f"{day:%Y-%m-%d} · {plan}: {shown(value)} {unit}"
            bars.append(Bar(LEFT + index * slot + slot * 0.15, y, slot * 0.7, height, colours[plan], label))
            stacked += value
    ticks = [Tick(HEIGHT - BOTTOM - share * plot_height, shown(_tick(axis_top, share))) for share in (0, 0.5, 1)]
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
        total=sum(day_totals.values(), zero),
        first_day=all_days[0],
        last_day=today,
    )


def _tick(top: N, share: float) -> N:
    if isinstance(top, Decimal):
        return top * Decimal(str(share))
    return round(top * share)


def _round_up_money(value: Decimal) -> Decimal:
    """The axis' top for money: 1, 2 or 5 times a power of ten, at least `value` (and 0.01)."""
    magnitude = Decimal("0.01")
    while True:
        for factor in (1, 2, 5):
            if magnitude * factor >= value:
                return magnitude * factor
        magnitude *= 10


def _round_up(value: int) -> int:
    """The axis' top: 1, 2 or 5 times a power of ten, at least `value` (and at least 10)."""
    magnitude = 10
    while True:
        for factor in (1, 2, 5):
            if magnitude * factor >= value:
                return magnitude * factor
        magnitude *= 10
