"""Budgets over periods, in tokens or money, on plans, accounts, keys and teams.

Admission (accounts.services.usage_admit) asks `budget_admit` under the row locks it
already holds: the user's account row, which serialises the user's own, their plan's and
their keys' budgets, and here the team's row, which serialises its members' admissions
(locked after the account, always in that order). What each budget has used is summed
from the ledger over its window: the charged tokens (charged_tokens_sum), or the costs of
the settled records and the reservations of those streaming (charged_cost_sum), so that
a reservation is held in money as it is in tokens and nothing overspends.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db.models import Min, Q, QuerySet

from accounts.models import (
    Account,
    ApiKey,
    Budget,
    Price,
    UsageRecord,
    charged_cost_sum,
    charged_tokens_sum,
)
from accounts.periods import ROLLING_30_DAYS, Window, rolling_reset, window_of
from accounts.prices import COST_QUANTUM, MILLION, cost_of, cost_text, price_at


class BudgetSpent(Exception):
    """A budget has no room for the request: what the 429 says, and the alert it earns."""

    def __init__(self, standing: BudgetStanding, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.standing = standing
        self.message = message
        self.retry_after = retry_after


@dataclass(frozen=True)
class BudgetStanding:
    """Where one budget stands for one subject (whose use counts) in its current window."""

    budget: Budget
    subject: str  # "user:<id>", "key:<id>" or "team:<id>"
    window: Window
    used: Decimal

    @property
    def remaining(self) -> Decimal:
        return max(Decimal(0), self.budget.amount - self.used)

    @property
    def soft_limit(self) -> Decimal | None:
        percent = self.budget.soft_limit_percent
        return None if percent is None else self.budget.amount * percent / 100

    def report(self) -> dict[str, object]:
        """The budget as /v1/usage shows it."""
        budget = self.budget
        money = budget.unit == Budget.Unit.MONEY

        def shown(value: Decimal) -> str | int:
            return cost_text(value) if money else int(value)

        return {
            "scope": budget.subject_kind,
            "period": budget.period,
            "unit": budget.unit,
            "currency": budget.currency if money else None,
            "limit": shown(budget.amount),
            "used": shown(self.used),
            "remaining": shown(self.remaining),
            "soft_limit_percent": budget.soft_limit_percent,
            "period_start": self.window.start.isoformat(),
            "resets_at": None if self.window.resets_at is None else self.window.resets_at.isoformat(),
        }


@dataclass(frozen=True)
class BudgetAdmission:
    """What the budgets grant a request: its answer's tokens, and what it holds in money."""

    granted: int
    reserved_cost: Decimal | None
    cost_currency: str
    standings: list[BudgetStanding]  # after this request's reservation


PERIOD_ADJECTIVES = {"day": "daily", "week": "weekly", "month": "monthly", "rolling_30d": "rolling 30-day"}
PERIOD_PHRASES = {"day": "today", "week": "this week", "month": "this month", "rolling_30d": "in the last 30 days"}


def budget_zone() -> ZoneInfo:
    return ZoneInfo(settings.CHAT_BUDGET_TIME_ZONE)


def team_of(account: Account, api_key: ApiKey | None) -> int | None:
    """The team a request counts against: its key's, for a service account's key; else its user's."""
    if api_key is not None and api_key.team_id is not None:
        return api_key.team_id
    return account.team_id


def budgets_for(*, account: Account, api_key: ApiKey | None, team_id: int | None) -> list[Budget]:
    """Every budget that applies to a request by the account's user through `api_key`."""
    applies = Q(plan_id=account.plan_id) | Q(account_id=account.pk)
    if api_key is not None:
        applies |= Q(api_key_id=api_key.pk)
    if team_id is not None:
        applies |= Q(team_id=team_id)
    return list(Budget.objects.filter(applies).order_by("pk"))


def budget_standings(
    *, account: Account, api_key: ApiKey | None = None, now: dt.datetime, budgets: list[Budget] | None = None
) -> list[BudgetStanding]:
    """Where each budget that applies stands now (for /v1/usage, and at admission)."""
    if budgets is None:
        budgets = budgets_for(account=account, api_key=api_key, team_id=team_of(account, api_key))
    zone = budget_zone()
    standings = []
    for budget in budgets:
        subject, records = _subject_records(budget, account.user_id, api_key)
        window = window_of(budget.period, now, zone)
        if budget.period == ROLLING_30_DAYS:
            oldest = records.filter(created_at__gte=window.start).aggregate(oldest=Min("created_at"))["oldest"]
            window = Window(window.start, window.end, rolling_reset(oldest, now), window.alert_key)
        standings.append(BudgetStanding(budget, subject, window, _used(budget, records, window)))
    return standings


def key_budget_cap(*, account: Account, period: str, unit: str, currency: str) -> Decimal | None:
    """The most a key's own budget may be: the least of its owner's budgets (the plan's and
    the account's) in the same period and unit (and currency, for money), and for tokens a
    day, the owner's tokens per day. None: nothing caps it."""
    same = Budget.objects.filter(Q(plan_id=account.plan_id) | Q(account_id=account.pk), period=period, unit=unit)
    if unit == Budget.Unit.MONEY:
        same = same.filter(currency=currency)
    caps = [budget.amount for budget in same]
    if unit == Budget.Unit.TOKENS and period == Budget.Period.DAY:
        caps.append(Decimal(account.limits.tokens_per_day))
    return min(caps, default=None)


def budget_admit(
    *,
    account: Account,
    api_key: ApiKey | None,
    team_id: int | None,
    model: str,
    prompt_tokens: int,
    granted: int,
    now: dt.datetime,
) -> BudgetAdmission:
    """Check a request against every budget that applies, under its admission's locks.

    Each budget in tokens needs room for the prompt and one token of answer, and caps the
    answer's tokens by what is left; each in money needs room for the cost of those at the
    model's price now, and caps the answer likewise. Raises BudgetSpent for the first that
    has no room; returns the tokens granted and the standings after this reservation.
    The caller holds the locks: the account's row, and the team's (services._team_admit).
    """
    budgets = budgets_for(account=account, api_key=api_key, team_id=team_id)
    price = price_at(model, now) if any(budget.unit == Budget.Unit.MONEY for budget in budgets) else None
    if not budgets:
        return BudgetAdmission(granted, _reserved(price, prompt_tokens, granted), _currency(price), [])
    standings = budget_standings(account=account, api_key=api_key, now=now, budgets=budgets)
    for standing in standings:
        granted = _granted_within(standing, price, prompt_tokens, granted, now)
    reserved = _reserved(price, prompt_tokens, granted)
    after = [
        BudgetStanding(
            each.budget, each.subject, each.window, each.used + _charge(each.budget, price, prompt_tokens, granted)
        )
        for each in standings
    ]
    return BudgetAdmission(granted, reserved, _currency(price), after)


def _granted_within(
    standing: BudgetStanding, price: Price | None, prompt_tokens: int, granted: int, now: dt.datetime
) -> int:
    budget, remaining = standing.budget, standing.budget.amount - standing.used
    if budget.unit == Budget.Unit.TOKENS:
        if remaining <= prompt_tokens:
            raise _spent(standing, f"{_scope(budget)} tokens", now)
        return min(granted, int(remaining) - prompt_tokens)
    if price is None or price.currency != budget.currency:
        return granted  # the request costs nothing in this budget's currency
    if cost_of(price, prompt_tokens=prompt_tokens, completion_tokens=1) > remaining:
        raise _spent(standing, f"{_scope(budget)} spending", now)
    if price.output_per_million == 0:
        return granted
    room = (remaining - cost_of(price, prompt_tokens=prompt_tokens, completion_tokens=0)) * MILLION
    fits = int((room / price.output_per_million).to_integral_value(rounding=ROUND_FLOOR))
    fits = min(granted, max(1, fits))
    while fits > 1 and cost_of(price, prompt_tokens=prompt_tokens, completion_tokens=fits) > remaining:
        fits -= 1  # the cost's rounding to COST_PLACES may put the last token over
    return fits


def _spent(standing: BudgetStanding, what: str, now: dt.datetime) -> BudgetSpent:
    window = standing.window
    resets_at = window.resets_at or now
    when = resets_at.astimezone(budget_zone()).isoformat(timespec="minutes")
    period = PERIOD_ADJECTIVES[standing.budget.period]
    message = f"This request would pass the {period} budget of {what}; it resets at {when}."
    return BudgetSpent(standing, message, retry_after=max(1, math.ceil((resets_at - now).total_seconds())))


def _scope(budget: Budget) -> str:
    return {"plan": "your plan's", "account": "your", "key": "this key's", "team": "your team's"}[budget.subject_kind]


def _subject_records(budget: Budget, user_id: int, api_key: ApiKey | None) -> tuple[str, QuerySet[UsageRecord]]:
    """Whose use a budget counts, and their records: a plan's and an account's budgets
    count the user's, a key's the key's, a team's the team's."""
    if budget.api_key_id is not None and api_key is not None:
        return f"key:{api_key.pk}", UsageRecord.objects.filter(api_key_id=api_key.pk)
    if budget.team_id is not None:  # the request's own team: budgets_for found it by it
        return f"team:{budget.team_id}", UsageRecord.objects.filter(team_id=budget.team_id)
    return f"user:{user_id}", UsageRecord.objects.filter(user_id=user_id)


def _used(budget: Budget, records: QuerySet[UsageRecord], window: Window) -> Decimal:
    in_window = records.filter(created_at__gte=window.start)  # a later window has no records yet
    if budget.unit == Budget.Unit.TOKENS:
        return Decimal(in_window.aggregate(used=charged_tokens_sum())["used"] or 0)
    used = in_window.filter(cost_currency=budget.currency).aggregate(used=charged_cost_sum())["used"]
    return (used or Decimal(0)).quantize(COST_QUANTUM)


def _charge(budget: Budget, price: Price | None, prompt_tokens: int, granted: int) -> Decimal:
    if budget.unit == Budget.Unit.TOKENS:
        return Decimal(prompt_tokens + granted)
    if price is None or price.currency != budget.currency:
        return Decimal(0)
    return cost_of(price, prompt_tokens=prompt_tokens, completion_tokens=granted)


def _reserved(price: Price | None, prompt_tokens: int, granted: int) -> Decimal | None:
    return None if price is None else cost_of(price, prompt_tokens=prompt_tokens, completion_tokens=granted)


def _currency(price: Price | None) -> str:
    return "" if price is None else price.currency
