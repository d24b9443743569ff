"""Prices per model and the cost of every request: chosen at admission, computed at
settlement, summed exactly (accounts.prices, accounts.services)."""

from __future__ import annotations

import csv
import datetime as dt
import io
import random
import uuid
from decimal import Decimal

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.urls import reverse
from django.utils import timezone
from prometheus_client import REGISTRY

from accounts.models import Price, UsageRecord
from accounts.prices import cost_of, cost_shown, cost_text, price_at, spend_of
from accounts.services import (
    account_for,
    usage_admit,
    usage_finish,
    usage_finish_from_cache,
    usage_spend_today,
)

pytestmark = pytest.mark.django_db

MODEL = "synthetic"
START = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)


def price(model: str = MODEL, *, valid_from: dt.datetime = START, **fields: object) -> Price:
    values: dict[str, object] = {"input_per_million": Decimal("0.15"), "output_per_million": Decimal("0.60")}
    return Price.objects.create(model=model, valid_from=valid_from, **(values | fields))


def admit(user, *, model: str = MODEL, prompt_tokens: int = 10, cache: str = "", at: dt.datetime | None = None) -> str:
    stream_id = uuid.uuid4().hex
    record, _, _ = usage_admit(
        user=user,
        limits=account_for(user).limits,
        requests=1,
        channel="api",
        model=model,
        stream_id=stream_id,
        producer="test",
        prompt_tokens=prompt_tokens,
        max_tokens=50,
        cache=cache,
    )
    if at is not None:  # admitted at another moment than now
        UsageRecord.objects.filter(pk=record.pk).update(created_at=at)
    return stream_id


def finish(stream_id: str, *, prompt_tokens: int = 10, completion_tokens: int = 7) -> UsageRecord:
    usage_finish(
        stream_id=stream_id,
        status="complete",
        finish_reason="stop",
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        ttft_ms=5,
        duration_ms=9,
    )
    return UsageRecord.objects.get(stream_id=stream_id)


def spend_metric(model: str, plan: str, currency: str) -> float:
    labels = {"model": model, "plan": plan, "currency": currency}
    return REGISTRY.get_sample_value("chatsite_spend_total", labels) or 0.0


def test_cost_is_tokens_times_the_price_per_million_in_exact_decimals():
    gpt = Price(input_per_million=Decimal("2.50"), output_per_million=Decimal("10"))

    assert cost_of(gpt, prompt_tokens=1_000, completion_tokens=500) == Decimal("0.0075000000")
    assert cost_of(gpt, prompt_tokens=1, completion_tokens=0) == Decimal("0.0000025")
    assert cost_of(gpt, prompt_tokens=0, completion_tokens=0) == Decimal(0)
    # 0.1 + 0.2 in floats is 0.30000000000000004; here it is what it says.
    tenth = Price(input_per_million=Decimal("100000"), output_per_million=Decimal("200000"))
    assert cost_of(tenth, prompt_tokens=1, completion_tokens=1) == Decimal("0.3")


def test_a_cost_is_kept_to_ten_places_rounding_half_to_even():
    odd = Price(input_per_million=Decimal("0.000001"), output_per_million=Decimal("0.000003"))

    # 1e-12 and 5e-11 of a unit: below the tenth place, rounded half to even.
    assert cost_of(odd, prompt_tokens=1, completion_tokens=0) == Decimal("0E-10")
    assert cost_of(odd, prompt_tokens=50, completion_tokens=0) == Decimal("0E-10")
    assert cost_of(odd, prompt_tokens=150, completion_tokens=0) == Decimal("2E-10")


def test_a_cache_hit_pays_the_cached_input_price_and_nothing_for_its_output_by_default():
    cheap_hits = Price(
        input_per_million=Decimal("1"), cached_input_per_million=Decimal("0.10"), output_per_million=Decimal("4")
    )

    assert cost_of(cheap_hits, prompt_tokens=1_000, completion_tokens=100, cached=True) == Decimal("0.0001")
    cheap_hits.charge_cache_hits = True
    assert cost_of(cheap_hits, prompt_tokens=1_000, completion_tokens=100, cached=True) == Decimal("0.0005")


def test_a_cache_hit_without_a_cached_input_price_pays_the_input_price():
    plain = Price(input_per_million=Decimal("1"), output_per_million=Decimal("4"))

    assert cost_of(plain, prompt_tokens=1_000, completion_tokens=100, cached=True) == Decimal("0.001")


def test_cost_text_is_a_plain_decimal_with_every_place_and_cost_shown_drops_the_trailing_zeros():
    assert cost_text(Decimal("0.0000123")) == "0.0000123000"
    assert cost_text(Decimal("1E-10")) == "0.0000000001"
    assert cost_text(Decimal(12)) == "12.0000000000"
    assert cost_shown(Decimal("0.0000123000")) == "0.0000123"
    assert cost_shown(Decimal("0E-10")) == "0.0"
    assert cost_shown(Decimal("3.5")) == "3.5"


def test_the_price_at_a_moment_is_the_latest_that_started_by_then():
    march = price(valid_from=START)
    april = price(valid_from=START + dt.timedelta(days=31), input_per_million=Decimal("0.30"))
    price("another-model", valid_from=START - dt.timedelta(days=1))

    assert price_at(MODEL, START - dt.timedelta(seconds=1)) is None
    assert price_at(MODEL, START) == march
    assert price_at(MODEL, START + dt.timedelta(days=30)) == march
    assert price_at(MODEL, START + dt.timedelta(days=31)) == april
    assert price_at("unpriced", START + dt.timedelta(days=31)) is None


def test_a_settled_record_stores_its_cost_and_currency(alice):
    price(currency="EUR")

    record = finish(admit(alice), prompt_tokens=1_000, completion_tokens=2_000)

    # 1,000 x 0.15 / 1e6 + 2,000 x 0.60 / 1e6
    assert record.cost == Decimal("0.00135")
    assert record.cost_currency == "EUR"


def test_a_record_streaming_or_of_an_unpriced_model_has_no_cost(alice):
    price()
    streaming = admit(alice)
    unpriced = finish(admit(alice, model="unpriced"))

    assert UsageRecord.objects.get(stream_id=streaming).cost is None
    assert unpriced.cost is None
    assert unpriced.cost_currency == ""


def test_a_price_change_mid_month_applies_to_requests_admitted_after_it(alice):
    price(valid_from=START)
    change = START + dt.timedelta(days=14, hours=12)
    price(valid_from=change, input_per_million=Decimal("1.50"), output_per_million=Decimal("6"))
    before = admit(alice, at=change - dt.timedelta(seconds=1))
    after = admit(alice, at=change)

    # Both settle after the change: the price is the one valid when each was admitted.
    assert finish(before, prompt_tokens=1_000, completion_tokens=1_000).cost == Decimal("0.00075")
    assert finish(after, prompt_tokens=1_000, completion_tokens=1_000).cost == Decimal("0.0075")


def test_a_price_set_after_admission_does_not_reach_back(alice):
    stream_id = admit(alice, at=START - dt.timedelta(minutes=1))
    price(valid_from=START)

    assert finish(stream_id).cost is None


@pytest.mark.parametrize(("charge_cache_hits", "expected"), [(False, Decimal("0.0000100")), (True, Decimal("0.00013"))])
def test_cache_hits_are_charged_as_configured(alice, charge_cache_hits, expected):
    price(cached_input_per_million=Decimal("1"), output_per_million=Decimal("6"), charge_cache_hits=charge_cache_hits)
    stream_id = admit(alice, prompt_tokens=10, cache="hit")

    usage_finish_from_cache(stream_id=stream_id, finish_reason="stop", ttft_ms=1, duration_ms=1, answer_tokens=20)

    record = UsageRecord.objects.get(stream_id=stream_id)
    assert record.completion_tokens == 0  # the ledger counts no generated tokens for a hit
    assert record.cost == expected  # 10 x 1 / 1e6, and 20 x 6 / 1e6 when hits' output is charged


def test_the_spend_of_a_thousand_settled_records_equals_the_sum_of_their_costs_to_the_last_decimal(alice, bob):
    price(input_per_million=Decimal("0.137911"), output_per_million=Decimal("0.553217"))
    price(
        "other",
        valid_from=START,
        currency="EUR",
        input_per_million=Decimal("3.000001"),
        output_per_million=Decimal("9"),
    )
    account = account_for(alice)
    account.tokens_per_day = 10**9  # a thousand requests' worth
    account.save(update_fields=["tokens_per_day"])
    chance = random.Random(32)
    expected: dict[str, Decimal] = {"USD": Decimal(0), "EUR": Decimal(0)}
    for n in range(1_000):
        model, currency = (MODEL, "USD") if n % 3 else ("other", "EUR")
        prompt, completion = chance.randint(1, 4_000), chance.randint(0, 2_000)
        record = finish(
            admit(alice, model=model, prompt_tokens=prompt), prompt_tokens=prompt, completion_tokens=completion
        )
        assert record.cost == cost_of(
            price_at(model, record.created_at), prompt_tokens=prompt, completion_tokens=completion
        )
        expected[currency] += record.cost
    finish(admit(bob))  # another user's spend is not alice's

    assert usage_spend_today(user=alice) == expected
    assert spend_of(UsageRecord.objects.filter(user=alice)) == expected
    assert (
        sum(UsageRecord.objects.filter(user=alice, cost_currency="USD").values_list("cost", flat=True))
        == expected["USD"]
    )


def test_todays_spend_leaves_out_yesterday(alice):
    price()
    finish(admit(alice, at=timezone.now() - dt.timedelta(days=1)), prompt_tokens=1_000_000, completion_tokens=0)
    finish(admit(alice), prompt_tokens=1_000_000, completion_tokens=0)

    assert usage_spend_today(user=alice) == {"USD": Decimal("0.15")}


def test_settling_counts_the_spend_by_model_plan_and_currency_once(alice, django_capture_on_commit_callbacks):
    price("metered", currency="CHF")
    before = spend_metric("metered", "default", "CHF")
    stream_id = admit(alice, model="metered")

    with django_capture_on_commit_callbacks(execute=True):
        finish(stream_id, prompt_tokens=1_000_000, completion_tokens=1_000_000)
        finish(stream_id, prompt_tokens=1_000_000, completion_tokens=1_000_000)  # settled again: counted once

    assert spend_metric("metered", "default", "CHF") == pytest.approx(before + 0.75)


def test_the_metrics_page_exports_the_spend(client, alice, django_capture_on_commit_callbacks):
    price("exported")
    with django_capture_on_commit_callbacks(execute=True):
        finish(admit(alice, model="exported"), prompt_tokens=1_000_000, completion_tokens=0)

    page = client.get("/metrics").content.decode()

    assert 'chatsite_spend_total{currency="USD",model="exported",plan="default"}' in page


def test_the_usage_admin_shows_each_records_cost_and_exports_it(admin_client, alice, bob):
    price()
    priced = finish(admit(alice), prompt_tokens=1_000, completion_tokens=0)
    unpriced = finish(admit(bob, model="unpriced"))

    page = admin_client.get(reverse("admin:accounts_usagerecord_changelist")).content.decode()
    response = admin_client.post(
        reverse("admin:accounts_usagerecord_changelist"),
        {"action": "export_csv", ACTION_CHECKBOX_NAME: [priced.pk, unpriced.pk]},
    )

    assert "0.00015 USD" in page
    rows = {row["user"]: row for row in csv.DictReader(io.StringIO(response.content.decode()))}
    assert (rows["alice"]["cost"], rows["alice"]["cost_currency"]) == ("0.0001500000", "USD")
    assert (rows["bob"]["cost"], rows["bob"]["cost_currency"]) == ("", "")


def test_prices_are_listed_and_added_in_the_admin(admin_client):
    price()
    listed = admin_client.get(reverse("admin:accounts_price_changelist"), {"currency": "USD"})
    added = admin_client.post(
        reverse("admin:accounts_price_add"),
        {
            "model": "other",
            "currency": "EUR",
            "input_per_million": "1.25",
            "cached_input_per_million": "",
            "output_per_million": "5",
            "valid_from_0": "2026-04-01",
            "valid_from_1": "00:00:00",
        },
    )

    assert listed.context["cl"].result_count == 1
    assert added.status_code == 302, added.content
    assert Price.objects.get(model="other").cached_input == Decimal("1.25")


def test_a_price_in_a_currency_that_is_not_a_three_letter_code_is_refused(admin_client):
    response = admin_client.post(
        reverse("admin:accounts_price_add"),
        {"model": "other", "currency": "usd", "input_per_million": "1", "output_per_million": "-5"},
    )

    assert response.status_code == 200
    assert set(response.context["adminform"].form.errors) >= {"currency", "output_per_million"}
    assert not Price.objects.exists()


def test_bob_who_is_not_staff_cannot_see_the_prices(bob_client):
    response = bob_client.get(reverse("admin:accounts_price_changelist"))

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_the_worked_example_of_the_operations_guide_holds():
    march = Price(
        input_per_million=Decimal("0.15"), cached_input_per_million=Decimal("0.075"), output_per_million=Decimal("0.60")
    )
    later = Price(input_per_million=Decimal("0.15"), output_per_million=Decimal("1.20"))

    assert cost_text(cost_of(march, prompt_tokens=1_200, completion_tokens=300)) == "0.0003600000"
    assert cost_text(cost_of(march, prompt_tokens=1_200, completion_tokens=300, cached=True)) == "0.0000900000"
    march.charge_cache_hits = True
    assert cost_text(cost_of(march, prompt_tokens=1_200, completion_tokens=300, cached=True)) == "0.0002700000"
    assert cost_text(cost_of(later, prompt_tokens=1_200, completion_tokens=300)) == "0.0005400000"
