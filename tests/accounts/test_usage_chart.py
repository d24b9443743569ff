"""The usage admin's chart: tokens per UTC day per plan over the last 30 days."""

from __future__ import annotations

import datetime as dt

import pytest
from django.urls import reverse
from django.utils import timezone

from accounts.models import DEFAULT_PLAN, Plan
from accounts.services import account_for
from accounts.usage_chart import tokens_per_day_per_plan, usage_chart
from tests.support.usage import usage

pytestmark = pytest.mark.django_db

TODAY = dt.date(2026, 3, 31)
CHANGELIST = reverse("admin:accounts_usagerecord_changelist")


@pytest.fixture
def pro(alice):
    plan = Plan.objects.create(name="pro", requests_per_minute=100, tokens_per_day=10**6)
    account = account_for(alice)
    account.plan = plan
    account.save()
    return plan


def test_tokens_are_summed_per_day_and_plan_within_the_last_30_days(alice, bob, pro):
    usage(alice, day=TODAY, prompt=10, completion=90)
    usage(alice, day=TODAY, prompt=1, completion=9)
    usage(bob, day=TODAY, prompt=5, completion=5)
    usage(bob, day=TODAY - dt.timedelta(days=29), completion=7)
    usage(bob, day=TODAY - dt.timedelta(days=30), completion=1000)  # 31 days ago: out

    totals = tokens_per_day_per_plan(today=TODAY)

    assert totals == {
        (TODAY, "pro"): 110,
        (TODAY, "default"): 10,
        (TODAY - dt.timedelta(days=29), "default"): 7,
    }


def test_a_user_without_an_account_yet_counts_under_the_default_plan(alice):
    assert not hasattr(alice, "account")
    usage(alice, day=TODAY, completion=3)

    assert tokens_per_day_per_plan(today=TODAY) == {(TODAY, DEFAULT_PLAN): 3}


def test_the_chart_stacks_one_bar_per_plan_and_day_scaled_to_a_round_top(alice, bob, pro):
    usage(alice, day=TODAY, completion=300)
    usage(bob, day=TODAY, completion=100)
    usage(bob, day=TODAY - dt.timedelta(days=1), completion=50)

    chart = usage_chart(today=TODAY)

    assert chart.plans == [("default", chart.plans[0][1]), ("pro", chart.plans[1][1])]
    assert chart.plans[0][1] != chart.plans[1][1]
    assert chart.total == 450
    assert [tick.label for tick in chart.ticks] == ["0", "250", "500"]  # 400 tokens on the top day: axis to 500
    today_bars = sorted((bar for bar in chart.bars if "2026-03-31" in bar.label), key=lambda bar: bar.y)
    assert [bar.label for bar in today_bars] == [
        "2026-03-31 · pro: 300 tokens",  # stacked on top of default's
        "2026-03-31 · default: 100 tokens",
    ]
    assert today_bars[1].height * 3 == pytest.approx(today_bars[0].height)
    assert today_bars[0].y + today_bars[0].height == pytest.approx(today_bars[1].y)
    assert today_bars[1].y + today_bars[1].height == pytest.approx(chart.baseline)
    yesterday = next(bar for bar in chart.bars if "2026-03-30" in bar.label)
    assert yesterday.x < today_bars[0].x
    assert [label.label for label in chart.day_labels][-1] == "03-31"


def test_the_usage_page_shows_the_chart_with_its_bars(admin_client, alice, pro):
    usage(alice, prompt=20, completion=22)

    page = admin_client.get(CHANGELIST).content.decode()

    assert 'data-role="usage-chart"' in page
    today = timezone.now().astimezone(dt.UTC).date()
    assert f"<title>{today:%Y-%m-%d} · pro: 42 tokens</title>" in page
    assert "admin-usage.css" in page
    assert "style=" not in page[page.index('data-role="usage-chart"') : page.index("</figure>")]


def test_the_chart_says_when_nothing_was_used(admin_client):
    page = admin_client.get(CHANGELIST).content.decode()

    assert "No tokens used in the last 30 days." in page


def test_people_who_are_not_staff_never_see_the_chart(alice_client, alice, pro):
    usage(alice, completion=5)

    response = alice_client.get(CHANGELIST)

    assert response.status_code == 302
    assert "/login/" in response["Location"]
