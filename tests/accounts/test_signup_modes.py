"""CHAT_SIGNUP: open (anyone), approval (an admin activates new accounts) or closed."""

from __future__ import annotations

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from tests.support import PASSWORD

pytestmark = pytest.mark.django_db

SIGNUP = {"username": "dave", "password1": PASSWORD, "password2": PASSWORD}


def log_in(client, password: str = PASSWORD):
    return client.post(reverse("accounts:login"), {"username": "dave", "password": password})


@pytest.fixture
def approval(settings):
    settings.CHAT_SIGNUP = "approval"


@pytest.fixture
def closed(settings):
    settings.CHAT_SIGNUP = "closed"


def test_in_approval_mode_the_signup_page_says_accounts_wait(client, approval):
    page = client.get(reverse("accounts:signup")).content.decode()

    assert "wait for an admin's approval" in page
    assert 'name="password1"' in page


def test_in_approval_mode_a_new_account_is_inactive_and_the_user_is_told(client, approval):
    response = client.post(reverse("accounts:signup"), SIGNUP, follow=True)

    assert response.redirect_chain == [(reverse("accounts:signup_pending"), 302)]
    assert "waits for an admin's approval" in response.content.decode()
    assert User.objects.get(username="dave").is_active is False
    assert "_auth_user_id" not in client.session
    assert client.get(reverse("generation:chat")).status_code == 302


def test_an_account_awaiting_approval_cannot_log_in_and_is_told_why(client, approval):
    client.post(reverse("accounts:signup"), SIGNUP)

    response = log_in(client)

    assert response.status_code == 200
    assert "_auth_user_id" not in client.session
    assert "not active yet" in response.content.decode()


def test_a_wrong_password_does_not_reveal_an_account_awaiting_approval(client, approval):
    client.post(reverse("accounts:signup"), SIGNUP)

    response = log_in(client, password="wrong-password-1")

    assert "not active yet" not in response.content.decode()
    assert "Please enter a correct username and password" in response.content.decode()


def test_an_admin_approves_accounts_in_the_users_admin_and_then_they_log_in(client, admin_client, approval):
    client.post(reverse("accounts:signup"), SIGNUP)
    dave = User.objects.get(username="dave")
    waiting = admin_client.get(reverse("admin:auth_user_changelist"), {"is_active__exact": "0"}).content.decode()
    assert ">dave</a>" in waiting

    admin_client.post(
        reverse("admin:auth_user_changelist"), {"action": "approve", ACTION_CHECKBOX_NAME: [dave.pk]}, follow=True
    )

    assert User.objects.get(username="dave").is_active
    assert log_in(client).status_code == 302
    assert "_auth_user_id" in client.session


def test_closed_signup_is_a_403_page_without_a_form(client, closed):
    response = client.get(reverse("accounts:signup"))

    assert response.status_code == 403
    assert "Sign-up is closed" in response.content.decode()
    assert "password1" not in response.content.decode()


def test_closed_signup_refuses_a_post(client, closed):
    assert client.post(reverse("accounts:signup"), SIGNUP).status_code == 403
    assert not User.objects.filter(username="dave").exists()


def test_the_login_page_offers_signup_unless_it_is_closed(client, settings):
    signup_link = f'href="{reverse("accounts:signup")}"'
    assert signup_link in client.get(reverse("accounts:login")).content.decode()

    settings.CHAT_SIGNUP = "closed"

    assert signup_link not in client.get(reverse("accounts:login")).content.decode()


def test_an_admin_still_makes_accounts_when_signup_is_closed(admin_client, client, closed):
    inline = {"account-TOTAL_FORMS": "0", "account-INITIAL_FORMS": "0"}  # the plan inline, left to its default
    admin_client.post(reverse("admin:auth_user_add"), {**SIGNUP, "usable_password": "true", **inline})

    assert User.objects.get(username="dave").is_active
    assert log_in(client).status_code == 302


def _sign_up(client, username: str, address: str):
    form = {**SIGNUP, "username": username}
    return client.post(reverse("accounts:signup"), form, REMOTE_ADDR=address)


def test_one_address_makes_at_most_the_limit_of_accounts_a_minute(client, settings):
    settings.CHAT_SIGNUPS_PER_MINUTE = 2
    made = [_sign_up(Client(), f"user{n}", "198.51.100.7") for n in range(2)]
    refused = _sign_up(client, "user2", "198.51.100.7")

    assert [response.status_code for response in made] == [302, 302]
    assert refused.status_code == 429
    assert 0 < int(refused["Retry-After"]) <= 60
    assert "Too many new accounts from your address" in refused.content.decode()
    assert 'value="user2"' in refused.content.decode()  # the form is kept
    assert not User.objects.filter(username="user2").exists()


def test_the_signup_limit_is_per_address(client, settings):
    settings.CHAT_SIGNUPS_PER_MINUTE = 1
    first = _sign_up(Client(), "user0", "198.51.100.7")
    elsewhere = _sign_up(client, "user1", "198.51.100.8")

    assert first.status_code == elsewhere.status_code == 302


def test_a_refused_signup_form_is_not_counted(client, settings):
    settings.CHAT_SIGNUPS_PER_MINUTE = 1
    mismatched = client.post(
        reverse("accounts:signup"), {**SIGNUP, "password2": "something-else-entirely"}, REMOTE_ADDR="198.51.100.7"
    )
    made = _sign_up(Client(), "user0", "198.51.100.7")

    assert mismatched.status_code == 400
    assert made.status_code == 302


def test_the_signup_limit_follows_the_proxys_client_address_header(client, settings):
    settings.CHAT_SIGNUPS_PER_MINUTE = 1
    settings.CHAT_CLIENT_IP_HEADER = "HTTP_X_REAL_IP"
    first = Client().post(reverse("accounts:signup"), {**SIGNUP, "username": "u0"}, HTTP_X_REAL_IP="203.0.113.1")
    second = client.post(reverse("accounts:signup"), {**SIGNUP, "username": "u1"}, HTTP_X_REAL_IP="203.0.113.1")

    assert first.status_code == 302
    assert second.status_code == 429
