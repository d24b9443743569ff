"""A key's settings page (/accounts/keys/<id>/): its owner changes its limits, expiry,
models and budget, each within their own; the change holds from the key's very next
request in every process, and each save that changes something writes one audit record
with the before and after of what changed."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from accounts import key_cache
from accounts.models import Account, ApiKey, Budget, Plan, Team
from accounts.services import account_for, api_key_create
from audit.models import AuditRecord
from tests.generation.test_model_access import DEFAULT, OTHER, two_models
from tests.support.api_client import CHAT, assert_error, get, post

__all__ = ["two_models"]  # a fixture, used by name

pytestmark = pytest.mark.django_db(transaction=True)

KEYS = reverse("accounts:keys")
EMBEDDING = "all-minilm-l6-v2"
FORMAT = "%Y-%m-%dT%H:%M"  # what the page's date-time field shows and sends


def settings_url(key: ApiKey) -> str:
    return reverse("accounts:key_settings", args=[key.pk])


def sent(key: ApiKey, **changes: object) -> dict[str, object]:
    """What the page's form sends for `key` as the page shows it, with `changes`."""
    key.refresh_from_db()
    budget = key.budgets.first()
    data: dict[str, object] = {
        "requests_per_minute": key.requests_per_minute or "",
        "tokens_per_day": key.tokens_per_day or "",
        "max_concurrent_streams": key.max_concurrent_streams or "",
        "expires_at": timezone.localtime(key.expires_at).strftime(FORMAT) if key.expires_at else "",
        "allowed_models": list(key.allowed_models),
        "period": budget.period if budget else "month",
        "unit": budget.unit if budget else "money",
        "amount": f"{budget.amount:f}" if budget else "",
        "currency": budget.currency if budget else "USD",
    }
    return data | changes


def records() -> list[AuditRecord]:
    return list(AuditRecord.objects.filter(action=AuditRecord.Action.KEY_CHANGED).order_by("pk"))


@pytest.fixture
def key(alice) -> ApiKey:
    made, _ = api_key_create(user=alice, name="service")
    return made


@pytest.fixture
def keyed(alice) -> tuple[ApiKey, str]:
    return api_key_create(user=alice, name="service")


def test_the_keys_page_links_each_live_key_to_its_settings(alice, alice_client, key):
    revoked, _ = api_key_create(user=alice, name="old")
    revoked.revoke()

    page = alice_client.get(KEYS).content.decode()

    assert f'href="{settings_url(key)}" aria-label="Settings of service"' in page
    assert settings_url(revoked) not in page


def test_the_page_shows_the_keys_settings_and_the_owners_models(alice_client, key, two_models):
    ApiKey.objects.filter(pk=key.pk).update(
        requests_per_minute=5, expires_at=dt.datetime(2031, 5, 6, 7, 8, 9, tzinfo=dt.UTC), allowed_models=[OTHER]
    )

    response = alice_client.get(settings_url(key))

    page = response.content.decode()
    assert response.status_code == 200
    assert "Key settings: “service”" in page
    assert 'name="requests_per_minute" value="5"' in page
    assert 'value="2031-05-06T07:08"' in page
    assert "Expires at (UTC)" in page
    offered = response.context["form"].fields["allowed_models"].choices
    assert [name for name, _ in offered][:2] == [DEFAULT, OTHER]
    assert f'value="{OTHER}"' in page
    assert "checked" in page.split(f'value="{OTHER}"')[1].split(">")[0]
    assert "Now: none of its own" in page


def test_the_models_offered_are_the_owners_alone(alice, alice_client, key, two_models):
    Plan.objects.filter(pk=account_for(alice).plan_id).update(allowed_models=[OTHER])

    response = alice_client.get(settings_url(key))
    sneaked = alice_client.post(settings_url(key), sent(key, allowed_models=[DEFAULT]))

    assert [name for name, _ in response.context["form"].fields["allowed_models"].choices] == [OTHER]
    assert sneaked.status_code == 400
    assert f"Select a valid choice. {DEFAULT} is not one of the available choices." in sneaked.content.decode()
    key.refresh_from_db()
    assert key.allowed_models == []


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("requests_per_minute", 3, "3 requests/min"),
        ("tokens_per_day", 500, "500 tokens/day"),
        ("max_concurrent_streams", 1, "1 at once"),
    ],
)
def test_the_owner_changes_each_limit_and_the_keys_page_shows_it(alice_client, key, field, value, shown):
    response = alice_client.post(settings_url(key), sent(key, **{field: str(value)}), follow=True)

    assert response.redirect_chain == [(KEYS, 302)]
    key.refresh_from_db()
    assert getattr(key, field) == value
    page = response.content.decode()
    assert "Saved the settings of the key “service”" in page
    assert shown in page


def test_a_blank_limit_is_the_owners_again(alice_client, key):
    ApiKey.objects.filter(pk=key.pk).update(requests_per_minute=3, tokens_per_day=500)

    response = alice_client.post(settings_url(key), sent(key, requests_per_minute=""))

    assert response.status_code == 302
    key.refresh_from_db()
    assert (key.requests_per_minute, key.tokens_per_day) == (None, 500)


@pytest.mark.parametrize(
    ("field", "most"),
    [("requests_per_minute", 20), ("tokens_per_day", 200_000), ("max_concurrent_streams", 2)],
)
def test_a_limit_above_the_owners_plan_is_refused_with_a_clear_error(alice_client, key, field, most):
    response = alice_client.post(settings_url(key), sent(key, **{field: str(most + 1)}))

    assert response.status_code == 400
    assert f"Your plan allows at most {most}." in response.content.decode()
    key.refresh_from_db()
    assert getattr(key, field) is None
    assert records() == []
    assert alice_client.post(settings_url(key), sent(key, **{field: str(most)})).status_code == 302


def test_the_owners_own_limit_caps_a_key_as_their_plans_does(alice, alice_client, key):
    Account.objects.filter(pk=account_for(alice).pk).update(tokens_per_day=5000)

    response = alice_client.post(settings_url(key), sent(key, tokens_per_day="5001"))

    assert response.status_code == 400
    assert "Your plan allows at most 5000." in response.content.decode()


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"requests_per_minute": "two"}, "Enter a whole number."),
        ({"tokens_per_day": "0"}, "greater than or equal to 1"),
        ({"max_concurrent_streams": "-1"}, "greater than or equal to 1"),
        ({"requests_per_minute": "1.5"}, "Enter a whole number."),
        ({"expires_at": "tomorrow"}, "A date and time, such as 2030-01-31 18:00."),
        ({"expires_at": "2020-01-01T00:00"}, "Give a time to come, or leave it blank for never."),
        ({"expires_at": "2999-01-01T00:00"}, "At most 3650 days from now."),
        ({"allowed_models": ["no-such-model"]}, "Select a valid choice. no-such-model is not one of"),
        ({"amount": "lots"}, "Enter a number."),
        ({"unit": "tokens", "amount": "1.5"}, "A budget in tokens is a whole number."),
    ],
)
def test_malformed_settings_get_the_forms_error_and_change_nothing(alice_client, key, changes, error):
    response = alice_client.post(settings_url(key), sent(key, **({"requests_per_minute": "4"} | changes)))

    assert response.status_code == 400
    assert error in response.content.decode()
    key.refresh_from_db()
    assert (key.requests_per_minute, key.expires_at, key.allowed_models) == (None, None, [])
    assert not key.budgets.exists()
    assert records() == []


def test_an_empty_post_is_refused_not_taken_for_a_page_view(alice_client, key):
    response = alice_client.post(settings_url(key), {})

    assert response.status_code == 400
    assert "This field is required." in response.content.decode()


def test_the_owner_sets_an_expiry_and_takes_it_away(alice_client, key):
    later = timezone.localtime() + dt.timedelta(days=30)

    set_ = alice_client.post(settings_url(key), sent(key, expires_at=later.strftime(FORMAT)))
    key.refresh_from_db()
    expiry = key.expires_at
    never = alice_client.post(settings_url(key), sent(key, expires_at=""))

    assert set_.status_code == never.status_code == 302
    assert expiry == later.replace(second=0, microsecond=0)
    key.refresh_from_db()
    assert key.expires_at is None


def test_an_expired_key_may_be_given_a_new_expiry_and_works_again_at_once(alice_client, keyed):
    key, plain = keyed
    ApiKey.objects.filter(pk=key.pk).update(expires_at=timezone.now() - dt.timedelta(minutes=5))
    assert_error(get("/v1/models", plain), 401, "invalid_api_key")
    page = alice_client.get(settings_url(key)).content.decode()
    assert "expired since" in page

    kept = alice_client.post(settings_url(key), sent(key, requests_per_minute="9"))  # the past expiry sent back
    key.refresh_from_db()
    still_expired = key.expired()
    renewed = alice_client.post(settings_url(key), sent(key, expires_at=""))

    assert kept.status_code == renewed.status_code == 302
    assert still_expired
    assert get("/v1/models", plain).status_code == 200


def test_an_expiry_set_is_refused_by_the_api_once_it_passes(alice_client, keyed, monkeypatch):
    key, plain = keyed
    assert get("/v1/models", plain).status_code == 200  # remembered by this process
    later = timezone.localtime() + dt.timedelta(hours=2)
    assert alice_client.post(settings_url(key), sent(key, expires_at=later.strftime(FORMAT))).status_code == 302
    assert get("/v1/models", plain).status_code == 200

    after = timezone.now() + dt.timedelta(hours=2, minutes=1)
    monkeypatch.setattr(timezone, "now", lambda: after)

    assert_error(get("/v1/models", plain), 401, "invalid_api_key")


def test_the_owner_narrows_a_keys_models_and_widens_them_back_to_all_of_theirs(alice_client, key, two_models):
    narrowed = alice_client.post(settings_url(key), sent(key, allowed_models=[OTHER]), follow=True)
    key.refresh_from_db()
    models = key.allowed_models
    widened = alice_client.post(settings_url(key), sent(key, allowed_models=[]))

    assert models == [OTHER]
    assert f"models: {OTHER}" in narrowed.content.decode()
    assert widened.status_code == 302
    key.refresh_from_db()
    assert key.allowed_models == []


def test_an_embedding_model_is_offered_and_may_be_kept(alice_client, key, two_models):
    response = alice_client.get(settings_url(key))
    offered = [name for name, _ in response.context["form"].fields["allowed_models"].choices]

    if EMBEDDING not in offered:
        pytest.skip(f"{EMBEDDING} is not installed here")
    assert alice_client.post(settings_url(key), sent(key, allowed_models=[EMBEDDING, OTHER])).status_code == 302
    key.refresh_from_db()
    assert key.allowed_models == [OTHER, EMBEDDING]  # in the order offered: chat models first


def test_a_model_the_owner_lost_stays_on_the_key_until_unticked(alice, alice_client, key, two_models):
    ApiKey.objects.filter(pk=key.pk).update(allowed_models=["retired-model", OTHER])

    page = alice_client.get(settings_url(key)).content.decode()
    kept = alice_client.post(settings_url(key), sent(key, requests_per_minute="4"))
    key.refresh_from_db()
    models = key.allowed_models
    unticked = alice_client.post(settings_url(key), sent(key, allowed_models=[OTHER]))

    assert "retired-model (not yours to use now)" in page
    assert kept.status_code == unticked.status_code == 302
    assert models == ["retired-model", OTHER]  # as the admin wrote it: not a change
    key.refresh_from_db()
    assert key.allowed_models == [OTHER]
    [first, second] = records()
    assert "allowed_models" not in first.changes
    assert second.changes == {"allowed_models": [["retired-model", OTHER], [OTHER]]}


def test_the_budget_is_set_on_the_same_page_and_shown_on_the_keys_page(alice_client, key):
    response = alice_client.post(
        settings_url(key), sent(key, period="week", unit="tokens", amount="9000", currency=""), follow=True
    )

    [budget] = Budget.objects.filter(api_key=key)
    assert (budget.period, budget.unit, budget.amount) == ("week", "tokens", Decimal(9000))
    assert "budget: 9000 tokens per week (from Monday)" in response.content.decode()


def test_a_budget_over_the_plans_is_refused_on_the_settings_page_too(alice_client, key):
    Budget.objects.create(plan=Plan.objects.get(name="default"), period="month", unit="money", amount=Decimal(10))

    response = alice_client.post(settings_url(key), sent(key, amount="10.01", requests_per_minute="4"))

    assert response.status_code == 400
    assert "Your plan allows at most 10 USD in a monthly budget." in response.content.decode()
    key.refresh_from_db()
    assert key.requests_per_minute is None  # nothing of the save is kept


def test_the_page_sent_back_unchanged_changes_nothing_and_records_nothing(alice_client, key, two_models):
    expiry = timezone.now().replace(microsecond=123456) + dt.timedelta(days=3, seconds=17)
    ApiKey.objects.filter(pk=key.pk).update(expires_at=expiry, allowed_models=[OTHER, DEFAULT], tokens_per_day=700)
    budget = Budget.objects.create(api_key=key, period="day", unit="money", amount=Decimal("1.5"), currency="EUR")
    version = key_cache.access_version()

    response = alice_client.post(settings_url(key), sent(key), follow=True)

    assert "Nothing to change in the key “service”." in response.content.decode()
    key.refresh_from_db()
    assert key.expires_at == expiry  # to the microsecond, though the page shows minutes
    assert key.allowed_models == [OTHER, DEFAULT]
    assert Budget.objects.get(api_key=key).pk == budget.pk  # not made again: its alerts stay
    assert records() == []
    assert key_cache.access_version() == version


def test_one_save_writes_one_audit_record_with_the_before_and_after_of_what_changed(alice, alice_client, keyed):
    key, plain = keyed
    ApiKey.objects.filter(pk=key.pk).update(requests_per_minute=10)
    expiry = (timezone.localtime() + dt.timedelta(days=7)).replace(second=0, microsecond=0)

    alice_client.post(
        settings_url(key),
        sent(key, requests_per_minute="5", max_concurrent_streams="1", expires_at=expiry.strftime(FORMAT), amount="2"),
    )
    alice_client.post(settings_url(key), sent(key, amount="", requests_per_minute=""))

    first, second = records()
    assert first.actor == alice
    assert first.target == f"accounts.apikey:{key.pk} {key.prefix}…"
    assert first.changes == {
        "requests_per_minute": [10, 5],
        "max_concurrent_streams": [None, 1],
        "expires_at": [None, expiry.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")],
        "budget": [None, "2 USD per month"],
    }
    assert second.changes == {"requests_per_minute": [5, None], "budget": ["2 USD per month", None]}
    assert plain not in str(first.changes) + first.target
    assert key.hashed not in str(first.changes) + first.target


def test_the_budget_page_alone_keeps_the_keys_other_settings_and_is_recorded(alice_client, key):
    ApiKey.objects.filter(pk=key.pk).update(requests_per_minute=5, allowed_models=["synthetic"])

    response = alice_client.post(
        reverse("accounts:key_budget", args=[key.pk]), {"period": "day", "unit": "tokens", "amount": "50"}
    )

    assert response.status_code == 302
    key.refresh_from_db()
    assert (key.requests_per_minute, key.allowed_models) == (5, ["synthetic"])
    [record] = records()
    assert record.changes == {"budget": [None, "50 tokens per day"]}


def test_a_lower_rate_limit_holds_from_the_keys_very_next_request(alice, alice_client, fast_engine):
    key, plain = api_key_create(user=alice, name="service", requests_per_minute=5)
    body = {**CHAT, "max_tokens": 2}
    assert post("/v1/chat/completions", body, plain).status_code == 200  # remembered now, with its 5 a minute
    version = key_cache.access_version()

    assert alice_client.post(settings_url(key), sent(key, requests_per_minute="2")).status_code == 302
    second = post("/v1/chat/completions", body, plain)
    third = post("/v1/chat/completions", body, plain)

    assert key_cache.access_version() != version  # every process reads its keys afresh
    assert second.status_code == 200
    assert_error(third, 429, "rate_limit_exceeded")
    assert third.json()["error"]["message"] == "Rate limit reached: this key's 2 requests per minute."


def test_a_model_taken_off_a_key_is_not_found_on_its_very_next_request(alice_client, keyed, two_models):
    key, plain = keyed
    asked = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2}
    assert post("/v1/chat/completions", {**asked, "model": DEFAULT}, plain).status_code == 200

    assert alice_client.post(settings_url(key), sent(key, allowed_models=[OTHER])).status_code == 302
    refused = post("/v1/chat/completions", {**asked, "model": DEFAULT}, plain)
    allowed = post("/v1/chat/completions", {**asked, "model": OTHER}, plain)
    listed = get("/v1/models", plain).json()

    error = assert_error(refused, 404, "model_not_found")
    assert error["message"] == f"The model '{DEFAULT}' does not exist."
    assert allowed.status_code == 200
    assert [model["id"] for model in listed["data"]] == [OTHER]


def test_bob_can_neither_see_nor_change_alices_key(alice_client, bob_client, key):
    url = settings_url(key)

    assert bob_client.get(url).status_code == 404
    assert bob_client.post(url, sent(key, requests_per_minute="1")).status_code == 404
    key.refresh_from_db()
    assert key.requests_per_minute is None
    assert records() == []


def test_a_revoked_key_has_no_settings(alice_client, key):
    key.revoke()

    assert alice_client.get(settings_url(key)).status_code == 404
    assert alice_client.post(settings_url(key), sent(key, requests_per_minute="1")).status_code == 404


def test_an_unknown_key_is_404(alice_client):
    assert alice_client.get(reverse("accounts:key_settings", args=[99999])).status_code == 404


def test_anonymous_visitors_are_sent_to_log_in(client, key):
    url = settings_url(key)

    for response in (client.get(url), client.post(url, sent(key, requests_per_minute="1"))):
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("accounts:login"))
    key.refresh_from_db()
    assert key.requests_per_minute is None


def test_guests_are_refused_the_settings_page(settings, key):
    settings.CHAT_GUEST = True
    guest_client = Client(REMOTE_ADDR="198.51.100.7")
    assert guest_client.post(reverse("accounts:guest_start")).status_code == 302  # "Try it without an account"

    page = guest_client.get(settings_url(key))
    changed = guest_client.post(settings_url(key), sent(key, requests_per_minute="1"))

    assert page.status_code == changed.status_code == 403
    key.refresh_from_db()
    assert key.requests_per_minute is None


def test_a_teams_key_is_its_makers_to_change_as_its_budget_is(alice, bob, alice_client, bob_client, key):
    team = Team.objects.create(name="research")
    account_for(alice)
    account_for(bob)
    Account.objects.filter(user__in=[alice, bob]).update(team=team)
    ApiKey.objects.filter(pk=key.pk).update(team=team)

    assert bob_client.get(settings_url(key)).status_code == 404
    page = alice_client.get(settings_url(key)).content.decode()
    assert "of the team research" in page
    assert alice_client.post(settings_url(key), sent(key, requests_per_minute="3")).status_code == 302
    key.refresh_from_db()
    assert (key.requests_per_minute, key.team_id) == (3, team.pk)


def test_the_ratelimit_headers_report_a_new_limit_on_the_next_request(alice, keyed):
    # The key's access version lives in the site's cache (Redis with REDIS_URL): a
    # process that remembered the key sees a new version and reads the key again.
    key, plain = keyed
    assert get("/v1/models", plain)["x-ratelimit-limit-requests"] == "20"
    owner = Client()
    owner.force_login(alice)

    assert owner.post(settings_url(key), sent(key, requests_per_minute="7")).status_code == 302

    assert get("/v1/models", plain)["x-ratelimit-limit-requests"] == "7"
