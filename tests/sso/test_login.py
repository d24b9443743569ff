"""Logging in through the provider, with the code exchange played here (tests.sso.conftest):
users made or linked, claim mappings applied at every log-in, and bad tokens refused with a page."""

from __future__ import annotations

import base64
import hashlib
import time

import mozilla_django_oidc.auth
import pytest
import requests
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from accounts.models import DEFAULT_PLAN, Plan
from accounts.services import account_for, api_key_authenticate, api_key_create
from audit.models import AuditRecord
from sso.backends import OidcBackend
from sso.models import ClaimMapping, Identity
from tests.sso.conftest import REAL_GET_TOKEN, new_key

pytestmark = pytest.mark.django_db

ADA = {
    "sub": "sub-ada",
    "preferred_username": "ada",
    "email": "ada@example.com",
    "email_verified": True,
    "groups": ["/chat-admins", "/interns"],
}


@pytest.fixture
def interns():
    return Plan.objects.create(name="interns", requests_per_minute=3)


@pytest.fixture
def mappings(interns):
    ClaimMapping.objects.create(claim="groups", value="/chat-admins", is_staff=True, order=0)
    ClaimMapping.objects.create(claim="groups", value="/interns", plan=interns, order=10)


def logged_in_user(client: Client) -> User | None:
    response = client.get(reverse("generation:chat"))
    return response.wsgi_request.user if response.status_code == 200 else None


def test_the_log_in_sends_pkce_state_and_nonce_and_the_code_verifier_goes_with_the_code(client, provider):
    request = provider.start(client)
    assert request["response_type"] == "code"
    assert request["client_id"] == "chatsite"
    assert request["scope"] == "openid email profile"
    assert request["redirect_uri"] == "http://testserver/accounts/oidc/callback/"
    assert request["state"] and request["nonce"]
    assert request["code_challenge_method"] == "S256"

    provider.token_response = {"access_token": "a", "id_token": provider.id_token(nonce=request["nonce"], **ADA)}
    response = client.get(reverse("sso:callback"), {"code": "code-1", "state": request["state"]})

    assert response.status_code == 302
    verifier = provider.exchanges[0]["code_verifier"]
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    assert challenge == request["code_challenge"]
    assert provider.exchanges[0]["code"] == "code-1"


def test_the_first_log_in_makes_the_user_on_the_default_plan(client, provider):
    response = provider.log_in(client, **ADA)

    assert response.status_code == 302
    assert response["Location"] == reverse("generation:chat")
    user = User.objects.get(username="ada")
    assert logged_in_user(client) == user
    assert user.email == "ada@example.com"
    assert not user.has_usable_password()
    assert account_for(user).plan.name == DEFAULT_PLAN
    assert Identity.objects.get(user=user).subject == "sub-ada"
    actions = set(AuditRecord.objects.filter(actor=user).values_list("action", flat=True))
    assert {"signup", "login"} <= actions


def test_the_next_log_in_finds_the_same_user_by_subject_whatever_the_email_says(client, provider):
    provider.log_in(client, **ADA)
    client.logout()
    provider.log_in(client, **{**ADA, "email": "ada.lovelace@example.com", "preferred_username": "lovelace"})
    assert User.objects.filter(sso_identities__subject="sub-ada").get().username == "ada"
    assert User.objects.count() == 1


def test_a_verified_email_links_the_existing_user(client, provider, alice):
    alice.email = "Alice@Example.com"
    alice.save()
    provider.log_in(client, sub="sub-alice", email="alice@example.com", email_verified=True)
    assert logged_in_user(client) == alice
    assert Identity.objects.get(subject="sub-alice").user == alice


def test_an_unverified_email_makes_a_new_user_instead_of_linking(client, provider, alice):
    alice.email = "alice@example.com"
    alice.save()
    provider.log_in(client, sub="sub-alice", email="alice@example.com", email_verified=False)
    user = logged_in_user(client)
    assert user is not None
    assert user != alice
    assert user.username == "alice-2"
    assert user.email == ""


def test_a_superuser_is_never_taken_over_by_email(client, provider, admin_user):
    response = provider.log_in(client, sub="sub-root", email=admin_user.email, email_verified=True)
    assert response.status_code == 403
    assert "superuser" in response.content.decode()
    assert not Identity.objects.exists()


def test_claim_mappings_give_the_plan_and_staff_status(client, provider, mappings):
    provider.log_in(client, **ADA)
    user = User.objects.get(username="ada")
    assert account_for(user).plan.name == "interns"
    assert user.is_staff


def test_a_user_removed_from_a_group_loses_its_plan_and_staff_status_at_the_next_log_in(client, provider, mappings):
    provider.log_in(client, **ADA)
    client.logout()
    provider.log_in(client, **{**ADA, "groups": ["/chat-admins"]})
    user = User.objects.get(username="ada")
    assert account_for(user).plan.name == DEFAULT_PLAN
    assert user.is_staff
    client.logout()
    provider.log_in(client, **{**ADA, "groups": []})
    user.refresh_from_db()
    assert not user.is_staff


def test_a_plan_or_staff_change_made_by_the_groups_is_in_the_audit_trail(client, provider, mappings):
    provider.log_in(client, **ADA)
    client.logout()
    provider.log_in(client, **{**ADA, "groups": []})
    first, second = AuditRecord.objects.filter(action=AuditRecord.Action.CLAIMS_APPLIED).order_by("pk")
    assert first.changes == {"plan": [DEFAULT_PLAN, "interns"], "is_staff": [False, True]}
    assert second.changes == {"plan": ["interns", DEFAULT_PLAN], "is_staff": [True, False]}
    assert first.actor_name == second.actor_name == "ada"
    client.logout()
    provider.log_in(client, **{**ADA, "groups": []})  # nothing changes: nothing recorded
    assert AuditRecord.objects.filter(action=AuditRecord.Action.CLAIMS_APPLIED).count() == 2


def test_the_first_matching_row_gives_the_plan(client, provider, interns):
    seniors = Plan.objects.create(name="seniors")
    ClaimMapping.objects.create(value="/interns", plan=interns, order=10)
    ClaimMapping.objects.create(value="/seniors", plan=seniors, order=5)
    provider.log_in(client, **{**ADA, "groups": ["/interns", "/seniors"]})
    assert account_for(User.objects.get(username="ada")).plan == seniors


def test_without_plan_rows_the_plan_set_in_the_admin_is_kept(client, provider, interns):
    ClaimMapping.objects.create(value="/chat-admins", is_staff=True)
    provider.log_in(client, **ADA)
    user = User.objects.get(username="ada")
    account = account_for(user)
    account.plan = interns
    account.save()
    client.logout()
    provider.log_in(client, **ADA)
    assert account_for(user).plan == interns


def test_a_new_plan_from_the_mappings_reaches_the_users_api_keys_at_once(client, provider, mappings, interns):
    provider.log_in(client, **{**ADA, "groups": []})
    user = User.objects.get(username="ada")
    _, plain = api_key_create(user=user, name="laptop")
    assert api_key_authenticate(plain).user.account.plan.name == DEFAULT_PLAN  # remembered now
    client.logout()
    provider.log_in(client, **ADA)
    assert api_key_authenticate(plain).user.account.plan == interns


def test_a_deactivated_user_is_refused_and_their_session_ends(client, provider):
    provider.log_in(client, **ADA)
    user = User.objects.get(username="ada")
    user.is_active = False
    user.save()
    assert logged_in_user(client) is None
    response = provider.log_in(Client(), **ADA)
    assert response.status_code == 403
    assert "deactivated" in response.content.decode()


def test_a_user_deactivated_in_the_admin_loses_their_api_keys_at_once(client, provider, admin_client):
    provider.log_in(client, **ADA)
    user = User.objects.get(username="ada")
    _, plain = api_key_create(user=user, name="laptop")
    assert api_key_authenticate(plain) is not None  # remembered now
    change = reverse("admin:auth_user_change", args=[user.pk])
    form = admin_client.get(change).context["adminform"].form
    data = {name: value for name, value in form.initial.items() if value not in (None, False) and name != "password"}
    account = account_for(user)
    data.update(
        {
            "date_joined_0": user.date_joined.strftime("%Y-%m-%d"),
            "date_joined_1": user.date_joined.strftime("%H:%M:%S"),
            "account-TOTAL_FORMS": "1",
            "account-INITIAL_FORMS": "1",
            "account-MIN_NUM_FORMS": "0",
            "account-MAX_NUM_FORMS": "1",
            "account-0-id": account.pk,
            "account-0-user": user.pk,
            "account-0-plan": account.plan_id,
        }
    )
    for name in ("is_active", "date_joined", "last_login", "groups", "user_permissions"):
        data.pop(name, None)
    response = admin_client.post(change, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert api_key_authenticate(plain) is None


@pytest.mark.parametrize(
    ("claims", "reason", "text"),
    [
        ({"aud": "another-app"}, "audience", "wrong audience"),
        ({"iat": int(time.time()) - 3600, "exp": int(time.time()) - 3000}, "expired", "has expired"),
        ({"iss": "https://evil.example.com"}, "issuer", "wrong issuer"),
        ({"nonce": "nonce-of-an-earlier-log-in"}, "nonce", "replayed"),
    ],
)
def test_a_bad_token_is_refused_with_a_page_and_nothing_is_made(client, provider, mappings, claims, reason, text):
    response = provider.log_in(client, **{**ADA, **claims})
    assert response.status_code == 400
    page = response.content.decode()
    assert "Log-in refused" in page
    assert text in page
    assert logged_in_user(client) is None
    assert not User.objects.exists()
    assert not Identity.objects.exists()
    assert AuditRecord.objects.filter(action="login_failed", target=f"sso:{reason}").count() == 1


def test_a_token_with_a_bad_signature_is_refused_with_a_page_and_nothing_is_made(client, provider):
    request = provider.start(client)
    forged = provider.id_token(key=new_key(), nonce=request["nonce"], **ADA)
    provider.token_response = {"access_token": "a", "id_token": forged}
    response = client.get(reverse("sso:callback"), {"code": "c", "state": request["state"]})
    assert response.status_code == 400
    assert "signature is not valid" in response.content.decode()
    assert not User.objects.exists()


def test_a_callback_used_twice_is_refused_the_second_time(client, provider):
    request = provider.start(client)
    provider.token_response = {"access_token": "a", "id_token": provider.id_token(nonce=request["nonce"], **ADA)}
    callback = {"code": "code-1", "state": request["state"]}
    assert client.get(reverse("sso:callback"), callback).status_code == 302
    client.logout()
    replay = client.get(reverse("sso:callback"), callback)
    assert replay.status_code == 400
    assert "used already" in replay.content.decode()
    assert logged_in_user(client) is None


def test_a_callback_this_browser_did_not_start_is_refused(client, provider):
    provider.start(Client())
    response = client.get(reverse("sso:callback"), {"code": "c", "state": "someone-elses"})
    assert response.status_code == 400
    assert logged_in_user(client) is None


def test_a_code_the_provider_refuses_gives_a_clear_page(client, provider, monkeypatch):
    refused = requests.Response()
    refused.status_code = 400
    refused._content = b'{"error": "invalid_grant"}'
    monkeypatch.setattr(OidcBackend, "get_token", REAL_GET_TOKEN)
    monkeypatch.setattr(mozilla_django_oidc.auth.requests, "post", lambda *args, **kwargs: refused)
    request = provider.start(client)
    response = client.get(reverse("sso:callback"), {"code": "used", "state": request["state"]})
    assert response.status_code == 400
    assert "refused this log-in&#x27;s code" in response.content.decode()
    assert not User.objects.exists()


def test_the_providers_refusal_is_shown(client, provider):
    request = provider.start(client)
    response = client.get(reverse("sso:callback"), {"error": "access_denied", "state": request["state"]})
    assert response.status_code == 403
    assert "did not log you in (access_denied)" in response.content.decode()


def test_an_unreachable_provider_gives_a_clear_page(client, settings):
    settings.CHAT_OIDC_ISSUER = "http://127.0.0.1:9"  # discard: nothing listens
    settings.CHAT_OIDC_CLIENT_ID = "chatsite"
    settings.CHAT_OIDC_CLIENT_SECRET = "s3cret"
    settings.OIDC_TIMEOUT = 2
    response = client.get(reverse("sso:start"))
    assert response.status_code == 502
    assert "cannot be reached" in response.content.decode()


def test_without_configuration_the_sso_urls_are_not_found(client, settings):
    settings.CHAT_OIDC_ISSUER = ""
    assert client.get(reverse("sso:start")).status_code == 404
    assert client.get(reverse("sso:callback"), {"code": "c", "state": "s"}).status_code == 404


def test_a_password_log_in_does_not_reach_the_provider(client, provider, alice):
    response = client.post(reverse("accounts:login"), {"username": "alice", "password": "correct-horse-battery-staple"})
    assert response.status_code == 302
    assert provider.exchanges == []
