"""Logging in with two-factor on: the password, then a code from the app or a recovery code."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django_otp import DEVICE_ID_SESSION_KEY
from django_otp.plugins.otp_totp.models import TOTPDevice

from audit.models import AuditRecord
from tests.support import PASSWORD
from tests.twofactor.conftest import code_for, wrong_code_for
from twofactor.pending import SESSION_KEY

pytestmark = pytest.mark.django_db

LIMIT = 5  # CHAT_LOGIN_FAILURE_LIMIT's default


def log_in(client, username: str = "alice", password: str = PASSWORD, **data):
    return client.post(reverse("accounts:login"), {"username": username, "password": password, **data})


def send_code(client, code: str):
    return client.post(reverse("twofactor:verify"), {"code": code})


def logged_in(client) -> bool:
    return "_auth_user_id" in client.session


def verified(client) -> bool:
    return DEVICE_ID_SESSION_KEY in client.session


def unthrottle(device) -> None:
    """As if the wait after the last wrong code were over."""
    TOTPDevice.objects.filter(pk=device.pk).update(throttling_failure_timestamp=None, throttling_failure_count=0)


def test_without_two_factor_the_password_alone_logs_alice_in(client, alice):
    response = log_in(client)

    assert response.status_code == 302
    assert response["Location"] == reverse("generation:chat")
    assert logged_in(client)


def test_with_two_factor_the_password_alone_does_not_log_alice_in(client, alice_2fa):
    response = log_in(client)

    assert response["Location"] == reverse("twofactor:verify")
    assert not logged_in(client)
    assert client.get(reverse("generation:chat"))["Location"].startswith(reverse("accounts:login"))
    page = client.get(reverse("twofactor:verify")).content.decode()
    assert "Two-factor code" in page


def test_the_password_then_a_current_code_log_alice_in_verified(client, alice_2fa, steady_clock):
    log_in(client)

    response = send_code(client, code_for(alice_2fa.device))

    assert response.status_code == 302
    assert response["Location"] == reverse("generation:chat")
    assert logged_in(client)
    assert verified(client)
    assert SESSION_KEY not in client.session
    assert client.get(reverse("generation:chat")).status_code == 200


def test_the_page_asked_for_before_log_in_comes_after_the_code(client, alice_2fa, steady_clock):
    log_in(client, next="/accounts/keys/")

    assert send_code(client, code_for(alice_2fa.device))["Location"] == "/accounts/keys/"


@pytest.mark.parametrize("steps", [-1, 1])
def test_a_code_one_step_behind_or_ahead_of_the_clock_is_accepted(client, alice_2fa, steady_clock, steps):
    log_in(client)

    send_code(client, code_for(alice_2fa.device, steps=steps))

    assert logged_in(client)


@pytest.mark.parametrize("steps", [-3, 3])
def test_a_code_three_steps_behind_or_ahead_of_the_clock_is_refused(client, alice_2fa, steady_clock, steps):
    log_in(client)

    response = send_code(client, code_for(alice_2fa.device, steps=steps))

    assert response.status_code == 400
    assert "That code is not right" in response.content.decode()
    assert not logged_in(client)


def test_a_code_that_logged_in_once_does_not_log_in_again(client, alice_2fa, steady_clock):
    code = code_for(alice_2fa.device)
    log_in(client)
    send_code(client, code)
    client.post(reverse("accounts:logout"))
    unthrottle(alice_2fa.device)

    log_in(client)
    response = send_code(client, code)

    assert response.status_code == 400
    assert not logged_in(client)


def test_a_recovery_code_logs_in_once_and_not_twice(client, alice_2fa):
    code = alice_2fa.codes[0]
    log_in(client)
    assert send_code(client, code)["Location"] == reverse("generation:chat")
    assert verified(client)
    client.post(reverse("accounts:logout"))

    log_in(client)
    response = send_code(client, code)

    assert response.status_code == 400
    assert not logged_in(client)


def test_a_recovery_code_may_be_typed_in_capitals_with_a_dash(client, alice_2fa):
    code = alice_2fa.codes[1]
    log_in(client)

    send_code(client, f"{code[:4]}-{code[4:]}".upper())

    assert logged_in(client)


@pytest.mark.parametrize(
    ("typed", "message"),
    [
        ("12345a", "Enter the 6 digits your authenticator app shows, or one of your recovery codes."),
        ("1234567", "Enter the 6 digits your authenticator app shows, or one of your recovery codes."),
        ("<script>", "Enter the 6 digits your authenticator app shows, or one of your recovery codes."),
        ("1" * 200, "That is too long for a code."),
        ("", "Enter the code."),
    ],
)
def test_malformed_codes_are_refused_with_a_clear_message(client, alice_2fa, typed, message):
    log_in(client)

    response = send_code(client, typed)

    assert response.status_code == 400
    assert message in response.content.decode()
    assert not logged_in(client)


def test_after_a_wrong_code_the_right_one_waits_its_turn(client, alice_2fa, steady_clock):
    log_in(client)
    assert send_code(client, wrong_code_for(alice_2fa.device)).status_code == 400

    response = send_code(client, code_for(alice_2fa.device))

    assert response.status_code == 429
    assert "Too many wrong codes: wait 1 seconds" in response.content.decode()
    assert int(response["Retry-After"]) >= 1
    assert not logged_in(client)
    unthrottle(alice_2fa.device)
    assert send_code(client, code_for(alice_2fa.device)).status_code == 302


def test_wrong_codes_lock_out_like_wrong_passwords(client, alice_2fa, settings, steady_clock):
    settings.OTP_TOTP_THROTTLE_FACTOR = 0  # the lock-out alone, here
    right, wrong = code_for(alice_2fa.device), wrong_code_for(alice_2fa.device)
    log_in(client)

    statuses = [send_code(client, wrong).status_code for _ in range(LIMIT)]

    assert statuses == [400] * (LIMIT - 1) + [429]
    assert send_code(client, right).status_code == 429  # the right code, too late
    assert not logged_in(client)
    locked = log_in(client)
    assert locked.status_code == 429
    assert "Too many failed log-ins" in locked.content.decode()


def test_the_code_page_without_a_password_first_sends_to_log_in(client, alice_2fa):
    response = client.get(reverse("twofactor:verify"))

    assert response["Location"] == reverse("accounts:login")


def test_a_half_done_log_in_expires(client, alice_2fa, steady_clock):
    log_in(client)
    session = client.session
    session[SESSION_KEY] = {**session[SESSION_KEY], "until": 0}
    session.save()

    response = send_code(client, code_for(alice_2fa.device))

    assert response["Location"] == reverse("accounts:login")
    assert not logged_in(client)


def test_a_session_logged_in_without_a_code_is_asked_for_one(client, alice, alice_2fa, steady_clock):
    client.force_login(alice)  # as a single sign-on would

    response = client.get(reverse("accounts:keys"))
    assert response["Location"] == reverse("twofactor:verify") + "?next=%2Faccounts%2Fkeys%2F"

    assert client.post(response["Location"], {"code": code_for(alice_2fa.device)})["Location"] == "/accounts/keys/"
    assert client.get(reverse("accounts:keys")).status_code == 200


def test_the_audit_trail_has_the_log_in_only_after_the_code_and_the_wrong_codes(client, alice_2fa, steady_clock):
    log_in(client)
    assert not AuditRecord.objects.filter(action=AuditRecord.Action.LOGIN).exists()

    send_code(client, wrong_code_for(alice_2fa.device))
    unthrottle(alice_2fa.device)
    send_code(client, code_for(alice_2fa.device))

    failed = AuditRecord.objects.get(action=AuditRecord.Action.LOGIN_FAILED)
    assert failed.target == "username:alice"
    assert AuditRecord.objects.get(action=AuditRecord.Action.LOGIN).actor_name == "alice"
