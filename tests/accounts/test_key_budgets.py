"""A key's budget of its own, set by its owner on the keys page within their plan's, held
at admission, reported by the x-ratelimit headers where it is the tightest, and named with
its reset by the 429 it gives."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
import time_machine
from django.urls import reverse

from accounts.models import Account, Budget, Plan
from accounts.services import api_key_create
from tests.accounts.budget_helpers import budget, roomy, use
from tests.support.api_client import CHAT, assert_error, get, post

pytestmark = pytest.mark.django_db(transaction=True)

KEYS = reverse("accounts:keys")


def key_budget_url(key) -> str:
    return reverse("accounts:key_budget", args=[key.pk])


@pytest.fixture
def alices_key(alice):
    roomy(alice)
    key, _ = api_key_create(user=alice, name="service")
    return key


def test_the_owner_sets_a_keys_budget_in_money_and_the_keys_page_shows_it(alice_client, alices_key):
    response = alice_client.post(
        key_budget_url(alices_key), {"period": "month", "unit": "money", "amount": "2.50", "currency": "EUR"}
    )

    assert response.status_code == 302
    [saved] = Budget.objects.filter(api_key=alices_key)
    assert (saved.period, saved.unit, saved.amount, saved.currency) == ("month", "money", Decimal("2.5"), "EUR")
    assert 'value="2.5' in alice_client.get(key_budget_url(alices_key)).content.decode()  # the form shows it
    page = alice_client.get(KEYS).content.decode()
    assert "budget: 2.5 EUR per month" in page
    assert key_budget_url(alices_key) in page


def test_a_new_budget_replaces_the_keys_old_one_and_a_blank_amount_removes_it(alice_client, alices_key):
    url = key_budget_url(alices_key)
    alice_client.post(url, {"period": "day", "unit": "tokens", "amount": "500", "currency": ""})
    alice_client.post(url, {"period": "week", "unit": "tokens", "amount": "900", "currency": ""})
    [saved] = Budget.objects.filter(api_key=alices_key)
    assert (saved.period, saved.amount) == ("week", Decimal(900))
    assert alice_client.get(url).content.decode().count("900 tokens per week (from Monday)") == 1

    removed = alice_client.post(url, {"period": "week", "unit": "tokens", "amount": ""}, follow=True)

    assert not Budget.objects.filter(api_key=alices_key).exists()
    assert "Removed the budget of the key “service”." in removed.content.decode()


def test_a_keys_budget_may_not_pass_its_plans_in_the_same_period_and_currency(alice, alice_client, alices_key):
    budget(plan=Plan.objects.get(name="default"), period="month", unit="money", amount=Decimal("10"), currency="USD")
    url = key_budget_url(alices_key)

    over = alice_client.post(url, {"period": "month", "unit": "money", "amount": "10.01", "currency": "USD"})
    other_currency = alice_client.post(url, {"period": "month", "unit": "money", "amount": "50", "currency": "EUR"})

    assert over.status_code == 400
    assert "Your plan allows at most 10 USD in a monthly budget." in over.content.decode()
    assert other_currency.status_code == 302  # the plan's budget in USD caps no spending in EUR
    assert Budget.objects.get(api_key=alices_key).currency == "EUR"


def test_a_daily_token_budget_may_not_pass_the_owners_tokens_per_day(alice, alice_client, alices_key):
    Account.objects.filter(user=alice).update(tokens_per_day=5000)
    most = 5000

    response = alice_client.post(
        key_budget_url(alices_key), {"period": "day", "unit": "tokens", "amount": str(most + 1)}
    )

    assert response.status_code == 400
    assert f"Your plan allows at most {most} tokens in a daily budget." in response.content.decode()
    assert not Budget.objects.filter(api_key=alices_key).exists()


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"period": "day", "unit": "tokens", "amount": "1.5"}, "A budget in tokens is a whole number."),
        ({"period": "day", "unit": "money", "amount": "-1"}, "greater than or equal to"),
        ({"period": "day", "unit": "money", "amount": "lots"}, "Enter a number."),
        ({"period": "day", "unit": "money", "amount": "1", "currency": "usd"}, "A three-letter code in capitals"),
        ({"period": "fortnight", "unit": "money", "amount": "1"}, "Select a valid choice."),
    ],
)
def test_bad_input_gets_a_clear_form_error_and_saves_nothing(alice_client, alices_key, fields, error):
    response = alice_client.post(key_budget_url(alices_key), fields)

    assert response.status_code == 400
    assert error in response.content.decode()
    assert not Budget.objects.filter(api_key=alices_key).exists()


def test_bob_can_neither_see_nor_set_alices_keys_budget(alices_key, bob_client):
    url = key_budget_url(alices_key)

    assert bob_client.get(url).status_code == 404
    assert bob_client.post(url, {"period": "day", "unit": "tokens", "amount": "5"}).status_code == 404
    assert not Budget.objects.filter(api_key=alices_key).exists()
    assert url not in bob_client.get(KEYS).content.decode()


def test_a_revoked_keys_budget_cannot_be_set(alice_client, alices_key):
    alices_key.revoke()

    assert alice_client.get(key_budget_url(alices_key)).status_code == 404


def test_a_keys_budget_holds_at_admission_and_its_429_names_it_and_its_reset(
    alice, alice_client, alices_key, fast_engine
):
    key, plain = api_key_create(user=alice, name="other")
    alice_client.post(key_budget_url(key), {"period": "day", "unit": "tokens", "amount": "30"})
    with time_machine.travel(dt.datetime(2026, 3, 10, 12, tzinfo=dt.UTC), tick=False):
        use(alice, 30, api_key=key)

        refused = post("/v1/chat/completions", {**CHAT, "max_tokens": 5}, plain)
        usage = get("/v1/usage", plain).json()

    error = assert_error(refused, 429, "insufficient_quota")
    assert error["message"] == (
        "This request would pass the daily budget of this key's tokens; it resets at 2026-03-11T00:00+00:00."
    )
    assert refused["Retry-After"] == str(12 * 3600)
    assert refused["x-ratelimit-remaining-tokens"] == "0"
    assert refused["x-ratelimit-limit-tokens"] == "30"
    assert refused["x-ratelimit-reset-tokens"] == f"{12 * 3600}s"
    [shown] = usage["budgets"]
    assert (shown["scope"], shown["remaining"]) == ("key", 0)


def test_the_ratelimit_headers_report_a_budget_only_where_it_has_the_least_left(alice, fast_engine):
    account = roomy(alice)  # a billion tokens a day
    _, plain = api_key_create(user=alice, name="test")
    budget(account=account, period="week", amount=1000)
    budget(account=account, period="month", amount=50_000_000)  # roomier than the week's: never reported

    answered = post("/v1/chat/completions", {**CHAT, "max_tokens": 5}, plain)
    listed = get("/v1/models", plain)

    assert answered.status_code == 200
    usage = get("/v1/usage", plain)
    used = int(usage.json()["budgets"][0]["used"])
    assert usage.json()["tokens"]["per_day"] == 10**9  # the day's own figures stay the day's
    assert usage["x-ratelimit-limit-tokens"] == "1000"
    assert 0 < used < 1000
    assert answered["x-ratelimit-limit-tokens"] == "1000"
    assert 1000 - int(answered["x-ratelimit-remaining-tokens"]) >= used  # its reservation, held until settled
    assert listed["x-ratelimit-limit-tokens"] == "1000"
    assert listed["x-ratelimit-remaining-tokens"] == str(1000 - used)
    assert int(listed["x-ratelimit-reset-tokens"].removesuffix("s")) <= 7 * 24 * 3600


def test_the_ratelimit_headers_keep_the_days_tokens_where_they_are_tighter_than_any_budget(alice, fast_engine):
    account = roomy(alice)
    Account.objects.filter(pk=account.pk).update(tokens_per_day=500)
    _, plain = api_key_create(user=alice, name="test")
    budget(account=account, period="month", amount=10_000)

    listed = get("/v1/models", plain)

    assert listed["x-ratelimit-limit-tokens"] == "500"
    assert listed["x-ratelimit-remaining-tokens"] == "500"
