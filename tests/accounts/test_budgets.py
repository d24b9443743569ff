"""Budgets over periods (accounts.budgets): calendar weeks and months in the budget time zone,
the rolling window, money at the price of each request, and exact holds under concurrency."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
import time_machine
from django.core.exceptions import ValidationError
from django.db import transaction
from django.urls import reverse

from accounts.models import Budget, Plan, UsageRecord, charged_tokens_sum
from accounts.services import QuotaExceeded, api_key_create, usage_budgets
from generation.models import Message
from tests.accounts.budget_helpers import admit, budget, price, roomy, use
from tests.accounts.test_group_commit import at_once
from tests.support.api_client import CHAT, assert_error, get, post
from tests.support.chat import HTMX

pytestmark = pytest.mark.django_db(transaction=True)

UTC = dt.UTC


def at(*args: int) -> time_machine.travel:
    return time_machine.travel(dt.datetime(*args, tzinfo=UTC), tick=False)


def refusal_of(user, **kwargs) -> QuotaExceeded:
    with pytest.raises(QuotaExceeded) as refused:
        admit(user, **kwargs)
    assert refused.value.code == "insufficient_quota"
    return refused.value


def test_a_month_begins_at_midnight_in_the_budget_time_zone_not_utc(alice, settings):
    settings.CHAT_BUDGET_TIME_ZONE = "America/New_York"
    account = roomy(alice)
    budget(account=account, period=Budget.Period.MONTH, amount=100)
    with at(2026, 3, 1, 4, 30):  # 28 February, 23:30 in New York (EST): last month's
        use(alice, 90)
    with at(2026, 3, 1, 5, 30):  # 1 March, 00:30 in New York: this month's
        use(alice, 60)

    with at(2026, 4, 1, 3, 30):  # 31 March, 23:30 in New York (EDT); April in UTC
        use(alice, 40)
        refused = refusal_of(alice, prompt_tokens=1)

    assert refused.retry_after == 30 * 60  # April begins at 04:00 UTC there
    assert "2026-04-01T00:00-04:00" in refused.message
    with at(2026, 4, 1, 4, 0):
        _, granted = admit(alice, prompt_tokens=10, max_tokens=500)
    assert granted == 90


def test_a_week_begins_on_monday_in_the_budget_time_zone(alice, settings):
    settings.CHAT_BUDGET_TIME_ZONE = "Asia/Tokyo"
    budget(account=roomy(alice), period=Budget.Period.WEEK, amount=100)
    with at(2026, 2, 22, 14, 30):  # Sunday 22 February, 23:30 in Tokyo: the week before
        use(alice, 100)
    with at(2026, 2, 22, 15, 30):  # Monday 23 February, 00:30 in Tokyo (Sunday in UTC)
        use(alice, 60)
    with at(2026, 3, 1, 14, 0):  # Sunday 1 March, 23:00 in Tokyo: the same week
        use(alice, 40)
        refused = refusal_of(alice, prompt_tokens=1)

    assert refused.retry_after == 60 * 60
    with at(2026, 3, 1, 15, 0):  # Monday 2 March in Tokyo, still Sunday in UTC
        _, granted = admit(alice, prompt_tokens=10, max_tokens=50)
    assert granted == 50


def test_a_price_change_mid_month_charges_each_request_at_its_own_price(alice):
    account = roomy(alice)
    price("1", valid_from=dt.datetime(2026, 1, 1, tzinfo=UTC))
    price("3", valid_from=dt.datetime(2026, 3, 15, tzinfo=UTC))
    budget(account=account, period=Budget.Period.MONTH, unit=Budget.Unit.MONEY, amount=Decimal("0.001"))
    with at(2026, 3, 10):
        assert use(alice, 400).cost == Decimal("0.0004")
    with at(2026, 3, 20):
        assert use(alice, 100).cost == Decimal("0.0003")

    with at(2026, 3, 21):
        record, granted = admit(alice, prompt_tokens=50, max_tokens=200)
        # 0.0003 was left: 50 prompt tokens and 50 answer tokens at 3 per million.
        assert granted == 50
        assert record.reserved_cost == Decimal("0.0003")
        refusal_of(alice, prompt_tokens=1)
        report = usage_budgets(account=account).budgets

    assert report[0]["used"] == "0.0010000000"
    assert report[0]["remaining"] == "0.0000000000"
    assert report[0]["currency"] == "USD"


def test_a_rolling_window_frees_room_as_its_oldest_use_leaves_it(alice):
    budget(account=roomy(alice), period=Budget.Period.ROLLING_30_DAYS, amount=100)
    with at(2026, 3, 1, 12):
        use(alice, 80)
    with at(2026, 3, 20, 12):
        use(alice, 20)
        refused = refusal_of(alice, prompt_tokens=1)
    assert refused.retry_after == 11 * 24 * 3600  # when 1 March's use leaves the window

    with at(2026, 3, 31, 12, 0, 1):
        _, granted = admit(alice, prompt_tokens=10, max_tokens=500)
    assert granted == 70


def test_a_plans_budget_holds_for_each_of_its_users_alone(alice, bob):
    roomy(alice)
    budget(plan=roomy(bob).plan, amount=100)
    use(alice, 100)

    refusal_of(alice, prompt_tokens=1)
    _, granted = admit(bob, prompt_tokens=10, max_tokens=100)

    assert granted == 90


def test_a_keys_budget_counts_that_key_and_the_accounts_counts_them_all(alice):
    account = roomy(alice)
    capped, _ = api_key_create(user=alice, name="capped")
    other, _ = api_key_create(user=alice, name="other")
    budget(api_key=capped, amount=50)
    budget(account=account, amount=150)
    use(alice, 50, api_key=capped)

    refusal_of(alice, prompt_tokens=1, api_key=capped)
    use(alice, 90, api_key=other)
    _, granted = admit(alice, prompt_tokens=5, max_tokens=100, api_key=other)

    assert granted == 5  # the account's 150: 50 + 90 + 5 prompt tokens used


@pytest.mark.parametrize("each_alone", [False, True], ids=["grouped", "each-in-its-own-transaction"])
@pytest.mark.parametrize("unit", [Budget.Unit.TOKENS, Budget.Unit.MONEY])
def test_a_budget_holds_exactly_under_fifty_admissions_at_once(alice, unit, each_alone):
    """Each in a transaction of its own, admissions skip the group commit and race as those
    of separate processes do: the account's row lock alone keeps them apart."""
    account = roomy(alice)
    price("1", valid_from=dt.datetime(2026, 1, 1, tzinfo=UTC))
    amount = Decimal(200) if unit == Budget.Unit.TOKENS else Decimal("0.0002")  # 200 tokens either way
    budget(account=account, period=Budget.Period.MONTH, unit=unit, amount=amount)

    def one(_: int) -> object:
        if not each_alone:
            return admit(alice, prompt_tokens=10, max_tokens=10)
        with transaction.atomic():
            return admit(alice, prompt_tokens=10, max_tokens=10)

    outcomes = at_once(50, one)

    admitted = [outcome for outcome in outcomes if isinstance(outcome, tuple)]
    refused = [outcome for outcome in outcomes if isinstance(outcome, QuotaExceeded)]
    assert len(admitted) == 10
    assert len(refused) == 40
    assert UsageRecord.objects.aggregate(tokens=charged_tokens_sum())["tokens"] == 200


def test_a_budget_is_for_exactly_one_subject_and_tokens_are_whole(alice):
    plan = Plan.objects.get(name="default")
    with pytest.raises(ValidationError, match="exactly one"):
        Budget(plan=plan, account=roomy(alice), period="day", unit="tokens", amount=10).full_clean()
    with pytest.raises(ValidationError, match="whole number"):
        Budget(plan=plan, period="day", unit="tokens", amount=Decimal("1.5")).full_clean()


def test_the_api_refuses_past_a_budget_with_its_reset_and_reports_it(alice, bob, fast_engine):
    account = roomy(alice)
    roomy(bob)
    _, plain = api_key_create(user=alice, name="test")
    _, bobs = api_key_create(user=bob, name="test")
    budget(account=account, amount=30, soft_limit_percent=50)

    answers = [post("/v1/chat/completions", {**CHAT, "max_tokens": 5}, plain) for _ in range(10)]
    mine = get("/v1/usage", plain).json()
    theirs = get("/v1/usage", bobs).json()

    refused = answers[-1]
    assert_error(refused, 429, "insufficient_quota")
    assert "resets at" in refused.json()["error"]["message"]
    assert 1 <= int(refused["Retry-After"]) <= 24 * 3600
    [shown] = mine["budgets"]
    assert shown["scope"] == "account"
    assert shown["period"] == "day"
    assert shown["unit"] == "tokens"
    assert shown["limit"] == 30
    assert shown["used"] + shown["remaining"] == 30
    assert shown["used"] == UsageRecord.objects.filter(user=alice).aggregate(t=charged_tokens_sum())["t"]
    assert shown["soft_limit_percent"] == 50
    assert theirs["budgets"] == []  # bob sees nothing of alice's


def test_the_chat_page_is_refused_past_the_same_budget_in_words(alice, alice_client, fast_engine):
    budget(account=roomy(alice), amount=30)
    use(alice, 30)  # through the API's ledger: the same budget for every channel

    response = alice_client.post(reverse("generation:chat"), {"prompt": "Hello?"}, **HTMX)

    assert response.status_code == 429
    assert int(response["Retry-After"]) > 0
    assert "would pass the daily budget of your tokens" in response.content.decode()
    assert not Message.objects.filter(conversation__user=alice).exists()
