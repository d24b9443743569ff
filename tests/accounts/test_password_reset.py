"""Password reset by e-mail (when EMAIL_HOST is set), the account's e-mail address, and
the page that says an administrator resets passwords when no e-mail is set up."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client
from django.urls import reverse

from audit.models import AuditRecord
from tests.support import PASSWORD

pytestmark = pytest.mark.django_db

NEW_PASSWORD = "a-new-and-long-passphrase"
LINK = re.compile(r"http://testserver(/accounts/password/reset/[^/]+/[^/]+/)")


@pytest.fixture
def email_on(settings):
    settings.CHAT_EMAIL = True


@pytest.fixture
def alice_with_email(alice):
    alice.email = "alice@example.com"
    alice.save()
    return alice


def ask_reset(client: Client, address: str = "alice@example.com", **extra: str):
    return client.post(reverse("accounts:password_reset"), {"email": address}, **extra)


def test_the_log_in_page_offers_a_reset(client):
    page = client.get(reverse("accounts:login")).content.decode()

    assert f'<a href="{reverse("accounts:password_reset")}">Forgot your password?</a>' in page


def test_without_email_the_reset_page_says_an_administrator_resets_passwords(client, alice_with_email):
    get = client.get(reverse("accounts:password_reset"))
    post = ask_reset(client)

    assert get.status_code == 200
    assert "Ask your administrator" in get.content.decode()
    assert post.status_code == 200
    assert not mail.outbox


def test_a_reset_link_by_email_sets_a_new_password(client, alice_with_email, email_on):
    response = ask_reset(client)

    assert response.status_code == 302
    assert response["Location"] == reverse("accounts:password_reset_done")
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["alice@example.com"]
    assert message.subject == "Reset your chatsite password"
    assert PASSWORD not in message.body
    link = LINK.search(message.body).group(1)
    form = client.get(link, follow=True)
    assert form.status_code == 200
    assert "Choose a new password" in form.content.decode()
    done = client.post(form.redirect_chain[-1][0], {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD})
    assert done.status_code == 302
    assert done["Location"] == reverse("accounts:password_reset_complete")
    assert User.objects.get(username="alice").check_password(NEW_PASSWORD)
    changed = AuditRecord.objects.filter(action=AuditRecord.Action.PASSWORD_CHANGED).get()
    assert changed.actor_name == "alice"
    reused = client.get(link, follow=True)
    assert "This reset link does not work" in reused.content.decode()


def test_an_unknown_address_gets_the_same_answer_and_no_email(client, alice_with_email, email_on):
    response = ask_reset(client, "nobody@example.com")

    assert response.status_code == 302
    assert response["Location"] == reverse("accounts:password_reset_done")
    assert not mail.outbox


def test_a_guest_or_a_user_without_a_password_gets_no_email(client, django_user_model, email_on):
    django_user_model.objects.create_user("sso-user", email="sso@example.com")  # unusable password

    assert ask_reset(client, "sso@example.com").status_code == 302
    assert not mail.outbox


@pytest.mark.parametrize("address", ["", "not-an-address", "a@" + "b" * 300 + ".com"])
def test_a_malformed_address_is_refused_with_the_reason(client, email_on, address):
    response = ask_reset(client, address)

    assert response.status_code == 200  # the form again, with its error
    assert 'class="errorlist' in response.content.decode()
    assert not mail.outbox


def test_one_address_may_ask_for_three_resets_a_minute(client, alice_with_email, email_on):
    statuses = [ask_reset(client, REMOTE_ADDR="203.0.113.9").status_code for _ in range(4)]
    elsewhere = ask_reset(client, REMOTE_ADDR="203.0.113.10")

    assert statuses == [302, 302, 302, 429]
    assert len(mail.outbox) == 4
    assert elsewhere.status_code == 302


def test_a_tampered_link_does_not_work(client, alice_with_email, email_on):
    ask_reset(client)
    link = LINK.search(mail.outbox[0].body).group(1)

    response = client.get(link[:-3] + "xx/", follow=True)

    assert "This reset link does not work" in response.content.decode()


def test_sign_up_takes_an_optional_email(client):
    response = client.post(
        reverse("accounts:signup"),
        {"username": "carol", "email": "carol@example.com", "password1": PASSWORD, "password2": PASSWORD},
    )
    without = Client().post(
        reverse("accounts:signup"), {"username": "dave", "password1": PASSWORD, "password2": PASSWORD}
    )

    assert response.status_code == 302
    assert without.status_code == 302
    assert User.objects.get(username="carol").email == "carol@example.com"
    assert User.objects.get(username="dave").email == ""


def test_the_email_page_sets_and_clears_the_address(alice, alice_client):
    saved = alice_client.post(reverse("accounts:email"), {"email": "alice@example.org"})
    alice.refresh_from_db()
    assert saved.status_code == 302
    assert alice.email == "alice@example.org"

    bad = alice_client.post(reverse("accounts:email"), {"email": "nope"})
    cleared = alice_client.post(reverse("accounts:email"), {"email": ""})
    alice.refresh_from_db()

    assert bad.status_code == 400
    assert cleared.status_code == 302
    assert alice.email == ""


def test_the_email_page_needs_log_in(client):
    response = client.get(reverse("accounts:email"))

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("accounts:login"))


def test_email_settings_that_cannot_both_hold_stop_start_up():
    env = {"EMAIL_USE_TLS": "1", "EMAIL_USE_SSL": "1", "DJANGO_SETTINGS_MODULE": "chatsite.settings", "PATH": ""}
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"], env=env, capture_output=True, text=True
    )

    assert result.returncode != 0
    assert "EMAIL_USE_TLS and EMAIL_USE_SSL cannot both be 1" in result.stderr
