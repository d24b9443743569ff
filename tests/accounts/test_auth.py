from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from tests.support import PASSWORD

pytestmark = pytest.mark.django_db


def test_signup_creates_the_account_and_logs_in(client):
    response = client.post(
        reverse("accounts:signup"), {"username": "dave", "password1": PASSWORD, "password2": PASSWORD}
    )
    assert response.status_code == 302
    assert get_user_model().objects.filter(username="dave").exists()
    assert client.get(reverse("generation:chat")).status_code == 200


def test_signup_with_mismatched_passwords_shows_the_error(client):
    response = client.post(
        reverse("accounts:signup"), {"username": "dave", "password1": PASSWORD, "password2": "different-one-1"}
    )
    assert response.status_code == 400
    assert "match" in response.content.decode()
    assert 'class="errorlist' in response.content.decode()
    assert not get_user_model().objects.filter(username="dave").exists()


def test_signup_refuses_a_taken_username(client, alice):
    response = client.post(
        reverse("accounts:signup"), {"username": "alice", "password1": PASSWORD, "password2": PASSWORD}
    )
    assert response.status_code == 400
    assert get_user_model().objects.filter(username="alice").count() == 1


def test_signup_page_uses_djangos_field_names(client):
    page = client.get(reverse("accounts:signup")).content.decode()
    for name in ("username", "password1", "password2"):
        assert f'name="{name}"' in page


def test_login_and_logout(client, alice):
    page = client.get(reverse("accounts:login")).content.decode()
    assert 'name="username"' in page
    assert 'name="password"' in page
    response = client.post(reverse("accounts:login"), {"username": "alice", "password": PASSWORD})
    assert response.status_code == 302
    assert response["Location"] == reverse("generation:chat")
    assert client.post(reverse("accounts:logout")).status_code == 302
    assert client.get(reverse("generation:chat")).status_code == 302


def test_wrong_password_is_refused(client, alice):
    response = client.post(reverse("accounts:login"), {"username": "alice", "password": "wrong-password"})
    assert response.status_code == 200
    assert "_auth_user_id" not in client.session


def test_logged_in_user_visiting_signup_goes_to_chat(alice_client):
    assert alice_client.get(reverse("accounts:signup"))["Location"] == reverse("generation:chat")


def test_ensure_superuser_creates_the_admin_once(monkeypatch):
    from django.core.management import call_command

    monkeypatch.setenv("DJANGO_SUPERUSER_USERNAME", "root")
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", PASSWORD)
    call_command("ensure_superuser")
    call_command("ensure_superuser")
    admin = get_user_model().objects.get(username="root")
    assert admin.is_superuser
    assert admin.check_password(PASSWORD)


def test_ensure_superuser_without_password_fails(monkeypatch):
    from django.core.management import CommandError, call_command

    monkeypatch.setenv("DJANGO_SUPERUSER_USERNAME", "root")
    monkeypatch.delenv("DJANGO_SUPERUSER_PASSWORD", raising=False)
    with pytest.raises(CommandError, match="DJANGO_SUPERUSER_PASSWORD"):
        call_command("ensure_superuser")
