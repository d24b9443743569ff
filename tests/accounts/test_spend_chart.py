"""The usage admin's spend chart, beside the token chart: the settled records' costs per
UTC day per plan, in money, summed exactly, one chart per currency."""

from __future__ import annotations

import datetime as dt
import random
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from accounts.budgets import budget_standings
from accounts.models import Plan, Price, UsageRecord
from accounts.prices import cost_of, spend_of
from accounts.usage_chart import spend_chart, spend_per_day_per_plan
from tests.accounts.budget_helpers import MODEL, admit, budget, roomy, settle

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = reverse("admin:accounts_usagerecord_changelist")


def priced(model: str = MODEL, *, currency: str = "USD", per_million: str = "0.123457") -> None:
    Price.objects.create(
        model=model,
        currency=currency,
        input_per_million=Decimal(per_million),
        output_per_million=Decimal(per_million) * 3,
        valid_from=timezone.now() - dt.timedelta(days=400),
    )


def spent(user, prompt: int, completion: int, *, days_ago: int = 0) -> UsageRecord:
    record, _ = admit(user, prompt_tokens=prompt, max_tokens=completion)
    record = settle(record, completion_tokens=completion)
    if days_ago:
        UsageRecord.objects.filter(pk=record.pk).update(created_at=record.created_at - dt.timedelta(days=days_ago))
    return record


@pytest.fixture
def pro(alice, bob):
    plan = Plan.objects.create(name="pro")
    account = roomy(alice)
    account.plan = plan
    account.save()
    roomy(bob)
    return plan


def test_spend_is_the_exact_sum_of_settled_costs_per_day_and_plan(alice, bob, pro):
    priced()
    today = timezone.now().astimezone(dt.UTC).date()
    mine = [spent(alice, 1234, 567), spent(alice, 7, 1)]
    theirs = spent(bob, 99, 1)
    yesterday = spent(bob, 10, 10, days_ago=1)
    spent(bob, 10, 10, days_ago=30)  # 31 days ago counting today: out
    admit(alice, prompt_tokens=500, max_tokens=500)  # still streaming: no cost yet

    totals = spend_per_day_per_plan(currency="USD", today=today)

    assert totals == {
        (today, "pro"): mine[0].cost + mine[1].cost,
        (today, "default"): theirs.cost,
        (today - dt.timedelta(days=1), "default"): yesterday.cost,
    }
    assert all(isinstance(value, Decimal) for value in totals.values())
    assert spend_per_day_per_plan(currency="EUR", today=today) == {}


def test_the_spend_chart_stacks_plans_and_labels_each_bar_in_money(alice, bob, pro):
    priced(per_million="1")
    today = timezone.now().astimezone(dt.UTC).date()
    spent(alice, 3_000, 1_000)  # 0.003 + 0.003
    spent(bob, 1_000, 0)  # 0.001

    chart = spend_chart(currency="USD", today=today)

    assert chart.total == Decimal("0.007")
    assert [tick.label for tick in chart.ticks] == ["0.0", "0.005", "0.01"]
    labels = sorted(bar.label for bar in chart.bars)
    assert labels == [f"{today:%Y-%m-%d} · default: 0.001 USD", f"{today:%Y-%m-%d} · pro: 0.006 USD"]
    tallest = max(chart.bars, key=lambda bar: bar.height)
    assert tallest.height == pytest.approx(min(bar.height for bar in chart.bars) * 6)


def test_staff_see_one_spend_chart_per_currency_beside_the_token_chart(admin_client, alice, pro):
    priced(per_million="1")
    priced("other", currency="EUR", per_million="2")
    spent(alice, 1_000, 0)
    record, _ = admit(alice, prompt_tokens=1_000, max_tokens=1)
    UsageRecord.objects.filter(pk=record.pk).update(model="other")
    settle(record, completion_tokens=0)
    today = timezone.now().astimezone(dt.UTC).date()

    page = admin_client.get(CHANGELIST).content.decode()

    assert 'data-role="usage-chart"' in page
    assert page.count('data-role="spend-chart"') == 2
    assert "Spend in EUR per day per plan" in page
    assert "Spend in USD per day per plan" in page
    assert f"<title>{today:%Y-%m-%d} · pro: 0.001 USD</title>" in page


def test_with_no_settled_cost_there_is_no_spend_chart(admin_client, alice):
    roomy(alice)
    spent(alice, 10, 10)  # no price: no cost

    page = admin_client.get(CHANGELIST).content.decode()

    assert 'data-role="usage-chart"' in page
    assert 'data-role="spend-chart"' not in page


def test_people_who_are_not_staff_never_see_the_spend(alice_client, alice, pro):
    priced()
    spent(alice, 10, 10)

    response = alice_client.get(CHANGELIST)

    assert response.status_code == 302
    assert "/login/" in response["Location"]


def test_a_thousand_settled_costs_sum_to_the_last_decimal_in_the_chart_the_budget_and_the_spend(alice):
    account = roomy(alice)
    priced(per_million="0.137911")
    price = Price.objects.get()
    chance = random.Random(32)
    now = timezone.now()
    records = []
    for n in range(1_000):
        prompt, completion = chance.randint(1, 4_000), chance.randint(0, 2_000)
        cost = cost_of(price, prompt_tokens=prompt, completion_tokens=completion, cached=n % 7 == 0)
        records.append(
            UsageRecord(
                user=alice,
                channel="api",
                model=MODEL,
                stream_id=f"exact-{n}",
                status=UsageRecord.Status.COMPLETE,
                prompt_tokens=prompt,
                completion_tokens=completion,
                cost=cost,
                cost_currency="USD",
                created_at=now,
            )
        )
    UsageRecord.objects.bulk_create(records)
    expected = sum((record.cost for record in records), Decimal(0))
    budget(account=account, period="month", unit="money", amount=Decimal(10_000))

    [standing] = budget_standings(account=account, now=now)
    chart = spend_chart(currency="USD")

    assert expected.as_tuple().exponent == -10 and expected > 0
    assert spend_of(UsageRecord.objects.filter(user=alice)) == {"USD": expected}
    assert standing.used == expected
    assert chart.total == expected
    assert isinstance(chart.total, Decimal)
