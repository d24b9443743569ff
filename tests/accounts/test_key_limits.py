"""An API key's limits of its own (expiry, requests per minute, tokens per day, streams at
once), each within its owner's: set on the keys page and in the admin, held exactly at
admission, reported by the x-ratelimit headers, and named by the 429 that a key's limit
gives."""

from __future__ import annotations

import datetime as dt
import re
import uuid

import pytest
from django.urls import reverse
from django.utils import timezone

from accounts.models import Account, ApiKey, UsageRecord
from accounts.services import QuotaExceeded, account_for, api_key_create, quota_for, usage_admit
from tests.accounts.test_group_commit import at_once
from tests.support.api_client import CHAT, assert_error, get, post

pytestmark = pytest.mark.django_db(transaction=True)

NEW_KEY = re.compile(r'<code data-role="new-api-key">([^<]+)</code>')


def limited(user, **limits) -> tuple[ApiKey, str]:
    return api_key_create(user=user, name="service", **limits)


def admit(user, key: ApiKey | None, *, prompt_tokens: int = 1, max_tokens: int = 10):
    account = Account.objects.select_related("plan").get(user=user)
    return usage_admit(
        user=user,
        limits=account.limits,
        requests=1,
        channel="api",
        model="synthetic",
        stream_id=uuid.uuid4().hex,
        producer="test",
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        api_key=key,
    )


def test_a_key_past_its_expiry_is_refused_even_while_remembered(alice, monkeypatch):
    _, plain = limited(alice, expires_at=timezone.now() + dt.timedelta(hours=1))
    assert get("/v1/models", plain).status_code == 200  # now remembered by this process

    later = timezone.now() + dt.timedelta(hours=1, seconds=1)
    monkeypatch.setattr(timezone, "now", lambda: later)

    assert_error(get("/v1/models", plain), 401, "invalid_api_key")


def test_a_key_made_with_limits_on_the_keys_page(alice, alice_client):
    response = alice_client.post(
        reverse("accounts:keys"),
        {"name": "ci", "expires_in_days": "30", "requests_per_minute": "3", "tokens_per_day": "500"},
    )

    assert response.status_code == 201
    key = ApiKey.objects.get(user=alice)
    assert key.requests_per_minute == 3
    assert key.tokens_per_day == 500
    assert key.max_concurrent_streams is None
    assert abs((key.expires_at - timezone.now()) - dt.timedelta(days=30)) < dt.timedelta(minutes=1)
    page = response.content.decode()
    assert "3 requests/min" in page
    assert "500 tokens/day" in page
    assert "active until" in page


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("requests_per_minute", "21", "Your plan allows at most 20."),
        ("tokens_per_day", "0", "greater than or equal to 1"),
        ("max_concurrent_streams", "two", "Enter a whole number."),
        ("expires_in_days", "3651", "less than or equal to 3650"),
        ("expires_in_days", "-1", "greater than or equal to 1"),
    ],
)
def test_the_keys_page_refuses_limits_beyond_the_plan_or_out_of_range(alice, alice_client, field, value, error):
    response = alice_client.post(reverse("accounts:keys"), {"name": "ci", field: value})

    assert response.status_code == 400
    assert error in response.content.decode()
    assert not ApiKey.objects.exists()


def test_a_keys_own_rate_limit_is_named_in_its_429_and_leaves_the_owners_other_keys(alice, fast_engine):
    _, capped = limited(alice, requests_per_minute=2)
    _, free = api_key_create(user=alice, name="free")
    body = {**CHAT, "max_tokens": 2}

    answers = [post("/v1/chat/completions", body, capped) for _ in range(3)]
    other = post("/v1/chat/completions", body, free)

    assert [answer.status_code for answer in answers[:2]] == [200, 200]
    assert_error(answers[2], 429, "rate_limit_exceeded")
    assert answers[2].json()["error"]["message"] == "Rate limit reached: this key's 2 requests per minute."
    assert int(answers[2]["Retry-After"]) >= 1
    assert other.status_code == 200


def test_a_keys_day_of_tokens_is_named_when_spent(alice, fast_engine):
    _, plain = limited(alice, tokens_per_day=40)
    body = {**CHAT, "max_tokens": 5}

    answers = [post("/v1/chat/completions", body, plain) for _ in range(20)]
    refused = answers[-1]

    assert [answer.status_code for answer in answers[:2]] == [200, 200]
    assert_error(refused, 429, "insufficient_quota")
    assert "this key has" in refused.json()["error"]["message"]
    assert sum(record.charged_tokens for record in UsageRecord.objects.filter(api_key__isnull=False)) <= 40


def test_the_headers_report_the_tighter_of_key_and_owner(alice, fast_engine):
    _, plain = limited(alice, requests_per_minute=3, tokens_per_day=1000)
    account_for(alice)

    response = get("/v1/models", plain)

    assert response["x-ratelimit-limit-requests"] == "3"
    assert response["x-ratelimit-remaining-requests"] == "3"
    assert response["x-ratelimit-limit-tokens"] == "1000"
    assert response["x-ratelimit-remaining-tokens"] == "1000"


def test_the_owners_limit_still_holds_over_a_keys_larger_one(alice):
    key, _ = limited(alice, tokens_per_day=10**9, requests_per_minute=10**6)
    limits = account_for(alice).limits

    quota = quota_for(alice, limits=limits, api_key=key)

    assert quota.limits.tokens_per_day == limits.tokens_per_day
    assert quota.limits.requests_per_minute == limits.requests_per_minute


def test_a_keys_stream_cap_holds_under_fifty_admissions_at_once(alice):
    Account.objects.filter(pk=account_for(alice).pk).update(max_concurrent_streams=100, tokens_per_day=10**6)
    capped, _ = limited(alice, max_concurrent_streams=3)
    free, _ = api_key_create(user=alice, name="free")

    outcomes = at_once(50, lambda index: admit(alice, capped if index % 2 else free))

    by_capped = [outcome for index, outcome in enumerate(outcomes) if index % 2]
    by_free = [outcome for index, outcome in enumerate(outcomes) if not index % 2]
    assert sum(not isinstance(outcome, Exception) for outcome in by_capped) == 3
    assert all(isinstance(outcome, QuotaExceeded) for outcome in by_capped if isinstance(outcome, Exception))
    assert not [outcome for outcome in by_free if isinstance(outcome, Exception)]
    assert UsageRecord.objects.filter(api_key=capped).count() == 3


def test_a_keys_tokens_hold_under_fifty_admissions_at_once(alice):
    Account.objects.filter(pk=account_for(alice).pk).update(max_concurrent_streams=100, tokens_per_day=10**6)
    capped, _ = limited(alice, tokens_per_day=100)

    outcomes = at_once(50, lambda _: admit(alice, capped, prompt_tokens=4, max_tokens=20))

    granted = [outcome for outcome in outcomes if not isinstance(outcome, Exception)]
    assert sum(4 + tokens for _, tokens, _ in granted) <= 100
    assert sum(record.charged_tokens for record in UsageRecord.objects.filter(api_key=capped)) <= 100
    assert len(granted) >= 4  # 100 tokens hold four requests of 24, then what is left


def test_the_admin_sets_a_keys_limits(admin_client, alice):
    key, _ = api_key_create(user=alice, name="ci")
    url = reverse("admin:accounts_apikey_change", args=[key.pk])

    response = admin_client.post(
        url,
        {"name": "ci", "expires_at_0": "2030-01-01", "expires_at_1": "00:00:00", "requests_per_minute": "7"},
    )

    assert response.status_code == 302
    key.refresh_from_db()
    assert key.requests_per_minute == 7
    assert key.expires_at is not None
