"""Log-in throttling (django-axes): wrong passwords lock a username from an address for a while."""

from __future__ import annotations

import datetime as dt

import pytest
from axes.models import AccessAttempt
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import User
from django.test import RequestFactory
from django.urls import reverse

from accounts.client_address import client_ip
from tests.support import PASSWORD

pytestmark = pytest.mark.django_db

LIMIT = 5  # CHAT_LOGIN_FAILURE_LIMIT's default


def log_in(client, password: str = PASSWORD, username: str = "alice", **extra):
    return client.post(reverse("accounts:login"), {"username": username, "password": password}, **extra)


def logged_in(client) -> bool:
    return "_auth_user_id" in client.session


@pytest.fixture
def passwords_checked(monkeypatch) -> list[str]:
    checked: list[str] = []
    check = User.check_password

    def counted(user, raw_password):
        checked.append(raw_password)
        return check(user, raw_password)

    monkeypatch.setattr(User, "check_password", counted)
    return checked


def test_thirty_wrong_passwords_are_refused_unchecked_once_the_limit_is_reached(client, alice, passwords_checked):
    statuses = [log_in(client, password=f"guess-{number}").status_code for number in range(30)]

    assert statuses == [200] * (LIMIT - 1) + [429] * (30 - LIMIT + 1)
    assert len(passwords_checked) == LIMIT  # the other 25 never reached the password


def test_the_right_password_is_refused_while_locked(client, alice, passwords_checked):
    for _ in range(LIMIT):
        log_in(client, password="wrong-password")

    response = log_in(client)

    assert response.status_code == 429
    assert not logged_in(client)
    assert PASSWORD not in passwords_checked


def test_the_lock_page_says_what_happened_and_how_long_it_lasts(client, alice):
    for _ in range(LIMIT):
        response = log_in(client, password="wrong-password")

    page = response.content.decode()
    assert "Too many failed log-ins" in page
    assert "for “alice”" in page
    assert "Try again in 15 minutes" in page
    assert 895 <= int(response["Retry-After"]) <= 900


def test_an_admin_sees_the_lockout_and_lifts_it(client, alice, admin_client):
    for _ in range(LIMIT):
        log_in(client, password="wrong-password")
    changelist = reverse("admin:axes_accessattempt_changelist")
    locked = admin_client.get(changelist, {"locked_out": "yes"}).content.decode()
    assert "alice" in locked
    assert "127.0.0.1" in locked
    attempt = AccessAttempt.objects.get(username="alice")

    admin_client.post(changelist, {"action": "delete_selected", ACTION_CHECKBOX_NAME: [attempt.pk], "post": "yes"})

    assert not AccessAttempt.objects.exists()
    assert log_in(client).status_code == 302
    assert logged_in(client)


def test_the_lock_ends_after_the_cool_off(client, alice):
    for _ in range(LIMIT):
        log_in(client, password="wrong-password")

    AccessAttempt.objects.update(attempt_time=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=15, seconds=1))

    assert log_in(client).status_code == 302


def test_a_successful_log_in_clears_the_failures(client, alice):
    for _ in range(LIMIT - 1):
        log_in(client, password="wrong-password")
    assert log_in(client).status_code == 302
    client.post(reverse("accounts:logout"))

    for _ in range(LIMIT - 1):
        assert log_in(client, password="wrong-password").status_code == 200
    assert log_in(client).status_code == 302


def test_the_lock_is_for_the_username_from_that_address_only(client, alice, bob):
    for _ in range(LIMIT):
        log_in(client, password="wrong-password")

    assert log_in(client, username="bob").status_code == 302  # another user from the same address
    client.post(reverse("accounts:logout"))
    assert log_in(client, REMOTE_ADDR="198.51.100.7").status_code == 302  # alice from elsewhere


def test_x_forwarded_for_is_ignored_unless_configured(client, alice):
    statuses = [
        log_in(client, password="wrong-password", HTTP_X_FORWARDED_FOR=f"203.0.113.{number}").status_code
        for number in range(LIMIT + 1)
    ]

    assert statuses[-2:] == [429, 429]  # a new address per attempt bought nothing


def test_behind_a_proxy_the_address_it_saw_is_the_clients(client, alice, settings):
    settings.CHAT_CLIENT_IP_HEADER = "HTTP_X_FORWARDED_FOR"
    # The proxy appends the address it saw; what comes before it, the client wrote.
    for number in range(LIMIT):
        log_in(client, password="wrong-password", HTTP_X_FORWARDED_FOR=f"10.9.9.{number}, 203.0.113.5")

    assert log_in(client, HTTP_X_FORWARDED_FOR="10.0.0.1, 203.0.113.5").status_code == 429
    assert log_in(client, HTTP_X_FORWARDED_FOR="203.0.113.6").status_code == 302


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        ({}, "192.0.2.1"),
        ({"HTTP_X_REAL_IP": "203.0.113.9"}, "203.0.113.9"),
        ({"HTTP_X_REAL_IP": "2001:db8::1"}, "2001:db8::1"),
        ({"HTTP_X_REAL_IP": "not-an-address"}, "192.0.2.1"),
        ({"HTTP_X_FORWARDED_FOR": "203.0.113.9"}, "192.0.2.1"),  # not the configured header
    ],
)
def test_client_ip_reads_only_the_configured_header(settings, meta, expected):
    settings.CHAT_CLIENT_IP_HEADER = "HTTP_X_REAL_IP"
    request = RequestFactory().get("/", REMOTE_ADDR="192.0.2.1", **meta)

    assert client_ip(request) == expected


def test_the_admin_log_in_is_throttled_too(client, admin_user):
    url = reverse("admin:login")
    statuses = [client.post(url, {"username": "admin", "password": "wrong"}).status_code for _ in range(LIMIT + 1)]

    assert statuses[-1] == 429
