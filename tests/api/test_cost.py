"""The cost of an API request: the x-chatsite-cost header, the usage chunk's field, /v1/usage."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from decimal import Decimal

import pytest

from accounts.models import Price, UsageRecord
from accounts.services import api_key_create
from tests.support.api_client import CHAT, MODEL, get, post, sse

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def alice_key(alice) -> str:
    return api_key_create(user=alice, name="test")[1]


@pytest.fixture
def bob_key(bob) -> str:
    return api_key_create(user=bob, name="test")[1]


@pytest.fixture
def priced() -> Price:
    """The chat model at 2 per million input tokens and 10 per million output tokens."""
    return Price.objects.create(
        model=MODEL,
        input_per_million=Decimal(2),
        output_per_million=Decimal(10),
        valid_from=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    )


def test_a_priced_answer_carries_its_cost_as_a_header(alice, alice_key, fast_engine, priced):
    response = post("/v1/chat/completions", {**CHAT, "max_tokens": 5}, alice_key)

    assert response.status_code == 200
    usage = response.json()["usage"]
    # 1 prompt token x 2 / 1e6 + 5 completion tokens x 10 / 1e6
    assert usage == {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6}
    assert response["x-chatsite-cost"] == "0.0000520000"
    assert response["x-chatsite-cost-currency"] == "USD"
    assert Decimal(response["x-chatsite-cost"]) == UsageRecord.objects.get(user=alice).cost


def test_a_text_completion_carries_its_cost_too(alice_key, fast_engine, priced):
    response = post("/v1/completions", {"model": MODEL, "prompt": "Hello", "max_tokens": 3}, alice_key)

    assert response.status_code == 200
    assert Decimal(response["x-chatsite-cost"]) == Decimal("0.000032")


def test_an_answer_without_a_price_has_no_cost_header(alice_key, fast_engine):
    response = post("/v1/chat/completions", {**CHAT, "max_tokens": 5}, alice_key)

    assert response.status_code == 200
    assert not response.has_header("x-chatsite-cost")
    assert not response.has_header("x-chatsite-cost-currency")


def test_a_refused_request_has_no_cost_header(alice_key, fast_engine, priced):
    response = post("/v1/chat/completions", {**CHAT, "max_tokens": 10**6}, alice_key)

    assert response.status_code == 400
    assert not response.has_header("x-chatsite-cost")


def usage_chunk(response) -> dict:
    events = sse(response)
    assert events[-1] == (None, "[DONE]")
    return json.loads(events[-2][1])


def test_a_priced_streams_usage_chunk_has_its_cost_and_currency(alice, alice_key, fast_engine, priced):
    body = {**CHAT, "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}

    response = post("/v1/chat/completions", body, alice_key)

    assert not response.has_header("x-chatsite-cost")  # the headers went before the answer
    usage = usage_chunk(response)["usage"]
    assert usage == {
        "prompt_tokens": 1,
        "completion_tokens": 5,
        "total_tokens": 6,
        "cost": "0.0000520000",
        "currency": "USD",
    }
    assert Decimal(usage["cost"]) == UsageRecord.objects.get(user=alice).cost


def test_an_unpriced_streams_usage_chunk_is_openais_alone(alice_key, fast_engine):
    body = {**CHAT, "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}

    usage = usage_chunk(post("/v1/chat/completions", body, alice_key))["usage"]

    assert set(usage) == {"prompt_tokens", "completion_tokens", "total_tokens"}


def test_a_resumed_stream_reports_the_cost_in_its_usage_chunk(alice_key, fast_engine, priced):
    first = post("/v1/chat/completions", {**CHAT, "max_tokens": 5, "stream": True}, alice_key)
    completion_id = json.loads(sse(first)[0][1])["id"]

    resumed = get(f"/v1/streams/{completion_id}?after=0&include_usage=1", alice_key)

    assert usage_chunk(resumed)["usage"]["cost"] == "0.0000520000"


def test_usage_reports_todays_spend_by_currency(alice_key, fast_engine, priced):
    assert get("/v1/usage", alice_key).json()["spend_today"] == {}

    post("/v1/chat/completions", {**CHAT, "max_tokens": 5}, alice_key)
    post("/v1/chat/completions", {**CHAT, "max_tokens": 5}, alice_key)

    assert get("/v1/usage", alice_key).json()["spend_today"] == {"USD": "0.0001040000"}


def test_bobs_usage_does_not_include_alices_spend(alice_key, bob_key, fast_engine, priced):
    post("/v1/chat/completions", {**CHAT, "max_tokens": 5}, alice_key)

    assert get("/v1/usage", bob_key).json()["spend_today"] == {}


def test_the_openapi_document_describes_the_cost(client):
    document = client.get("/v1/openapi.json").json()

    headers = document["paths"]["/chat/completions"]["post"]["responses"]["200"]["headers"]
    assert "x-chatsite-cost" in headers
    assert "cost" in document["components"]["schemas"]["CompletionUsage"]["properties"]
    assert "spend_today" in document["components"]["schemas"]["Usage"]["properties"]


def test_bob_cannot_resume_alices_priced_stream(alice_key, bob_key, fast_engine, priced):
    first = post("/v1/chat/completions", {**CHAT, "max_tokens": 5, "stream": True}, alice_key)
    completion_id = json.loads(sse(first)[0][1])["id"]

    response = get(f"/v1/streams/{completion_id}?after=0&include_usage=1", bob_key)

    assert response.status_code == 404


@pytest.mark.parametrize(("charge_cache_hits", "cost"), [(False, "0.0000020000"), (True, "0.0000520000")])
def test_an_answer_from_the_response_cache_is_charged_as_the_price_says(
    alice_key, fast_engine, priced, settings, charge_cache_hits, cost
):
    settings.CHAT_RESPONSE_CACHE = "user"
    if not settings.REDIS_URL:  # on Redis, conftest gives each test a key prefix of its own
        backend = "django.core.cache.backends.locmem.LocMemCache"
        settings.CACHES = {"default": {"BACKEND": backend, "LOCATION": uuid.uuid4().hex}}  # an empty one
    priced.charge_cache_hits = charge_cache_hits
    priced.save()
    body = {**CHAT, "max_tokens": 5, "temperature": 0}

    first = post("/v1/chat/completions", body, alice_key)
    again = post("/v1/chat/completions", body, alice_key)

    assert (first["x-chatsite-cache"], again["x-chatsite-cache"]) == ("miss", "hit")
    assert first["x-chatsite-cost"] == "0.0000520000"
    # Its prompt at the cached input price (blank: the input price); its output as configured.
    assert again["x-chatsite-cost"] == cost
