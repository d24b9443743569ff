"""The log-in page with single sign-on: the "Log in with <name>" link, and the password form
gone with CHAT_PASSWORD_LOGIN=0 (superusers still log in at the admin)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.support import PASSWORD

pytestmark = pytest.mark.django_db


@pytest.fixture
def sso_only(settings, provider):
    settings.CHAT_PASSWORD_LOGIN = False


def test_the_log_in_page_offers_the_provider_by_name(client, provider):
    page = client.get(reverse("accounts:login"), {"next": "/chat/x/"}).content.decode()
    assert f'href="{reverse("sso:start")}?next=/chat/x/"' in page
    assert ">Log in with Example SSO</a>" in page
    assert 'name="password"' in page


def test_without_a_provider_the_page_has_no_such_link(client, settings):
    settings.CHAT_OIDC_ISSUER = ""
    assert "Log in with" not in client.get(reverse("accounts:login")).content.decode()


def test_the_log_in_goes_back_to_the_page_asked_for(client, provider):
    request = provider.start(client)  # no next
    client.get(reverse("sso:start"), {"next": "/chat/?x=1"})
    state = client.session["oidc_states"]
    assert request["state"] in state
    assert client.session["oidc_login_next"] == "/chat/?x=1"


def test_a_next_page_on_another_site_is_ignored(client, provider):
    client.get(reverse("sso:start"), {"next": "https://evil.example.com/"})
    assert client.session["oidc_login_next"] is None


def test_with_password_log_in_off_the_form_and_sign_up_are_gone(client, sso_only):
    page = client.get(reverse("accounts:login")).content.decode()
    assert 'name="password"' not in page
    assert "Log in with Example SSO" in page
    assert reverse("accounts:signup") not in page
    assert client.get(reverse("accounts:signup")).status_code == 403


def test_with_password_log_in_off_a_password_is_refused(client, sso_only, alice):
    response = client.post(reverse("accounts:login"), {"username": "alice", "password": PASSWORD})
    assert response.status_code == 403
    assert "_auth_user_id" not in client.session


def test_with_password_log_in_off_a_superuser_still_logs_in_at_the_admin(client, sso_only, admin_user):
    response = client.post(reverse("admin:login"), {"username": "admin", "password": "password"})
    assert response.status_code == 302
    assert client.get(reverse("admin:index")).status_code == 200
