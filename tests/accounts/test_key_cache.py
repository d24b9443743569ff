"""API keys remembered between requests (accounts.key_cache): fast, and never stale."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from accounts import key_cache
from accounts.models import ApiKey, Plan
from accounts.services import account_for, api_key_authenticate, api_key_create

pytestmark = pytest.mark.django_db(transaction=True)


def models_status(plain: str) -> int:
    return Client().get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {plain}").status_code


def test_a_key_seen_before_is_checked_without_a_database_query(alice, django_assert_num_queries):
    _, plain = api_key_create(user=alice, name="hot")
    first = api_key_authenticate(plain)  # read from the database, last use written
    with django_assert_num_queries(0):
        again = api_key_authenticate(plain)
    assert first is not None
    assert again is not None
    assert again.pk == first.pk
    assert again.user == alice
    assert account_for(again.user).limits == account_for(alice).limits


def test_a_wrong_key_is_refused_and_not_remembered(alice, django_assert_num_queries):
    api_key_create(user=alice, name="real")
    assert api_key_authenticate("cs-not-a-key") is None
    with django_assert_num_queries(1):  # asked again: the database again
        assert api_key_authenticate("cs-not-a-key") is None


def test_a_key_revoked_on_the_keys_page_is_refused_on_the_very_next_request(alice, alice_client):
    _, plain = api_key_create(user=alice, name="soon revoked")
    assert models_status(plain) == 200
    assert models_status(plain) == 200  # remembered now
    key = ApiKey.objects.get(user=alice)
    assert alice_client.post(reverse("accounts:key_revoke", args=[key.pk])).status_code == 302
    assert models_status(plain) == 401


def test_a_key_revoked_in_the_admin_is_refused_on_the_very_next_request(alice, admin_client):
    key, plain = api_key_create(user=alice, name="soon revoked")
    assert models_status(plain) == 200
    response = admin_client.post(
        reverse("admin:accounts_apikey_changelist"), {"action": "revoke", "_selected_action": [key.pk]}
    )
    assert response.status_code == 302
    assert models_status(plain) == 401


def test_a_key_deleted_in_the_admin_is_refused_on_the_very_next_request(alice, admin_client):
    key, plain = api_key_create(user=alice, name="soon deleted")
    assert models_status(plain) == 200
    response = admin_client.post(reverse("admin:accounts_apikey_delete", args=[key.pk]), {"post": "yes"})
    assert response.status_code == 302
    assert models_status(plain) == 401


def test_a_plan_changed_in_the_admin_applies_on_the_very_next_request(alice, admin_client):
    _, plain = api_key_create(user=alice, name="planned")
    before = Client().get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {plain}")
    plan = account_for(alice).plan
    assert before["x-ratelimit-limit-requests"] == str(plan.requests_per_minute) != "7"
    response = admin_client.post(
        reverse("admin:accounts_plan_change", args=[plan.pk]),
        {
            "name": plan.name,
            "requests_per_minute": 7,
            "tokens_per_day": 1000,
            "max_concurrent_streams": 1,
            "max_tokens_per_request": 64,
            "priority": plan.priority,
            "max_documents_per_conversation": plan.max_documents_per_conversation,
            "max_document_bytes": plan.max_document_bytes,
        },
    )
    assert response.status_code == 302
    after = Client().get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {plain}")
    assert after["x-ratelimit-limit-requests"] == "7"
    assert Plan.objects.get(pk=plan.pk).requests_per_minute == 7


def test_a_change_behind_the_services_back_is_seen_within_the_maximum_age(alice, monkeypatch):
    _, plain = api_key_create(user=alice, name="old")
    assert models_status(plain) == 200
    ApiKey.objects.filter(user=alice).update(revoked_at=timezone.now())  # no version change
    assert models_status(plain) == 200  # still remembered
    later = key_cache.time.monotonic() + key_cache.MAX_AGE_S + 1
    monkeypatch.setattr(key_cache.time, "monotonic", lambda: later)
    assert models_status(plain) == 401


def test_last_use_is_still_written_for_a_remembered_key(alice, monkeypatch):
    key, plain = api_key_create(user=alice, name="used")
    assert models_status(plain) == 200
    an_hour_ago = timezone.now() - dt.timedelta(hours=1)
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=an_hour_ago)
    remembered = api_key_authenticate(plain)
    assert remembered is not None
    remembered.last_used_at = an_hour_ago  # the remembered copy is as old as the row
    assert models_status(plain) == 200
    key.refresh_from_db()
    assert key.last_used_at is not None
    assert key.last_used_at > an_hour_ago
