"""Setting up two-factor log-in: a secret and its QR code, a code from the app, recovery codes once."""

from __future__ import annotations

import re
from base64 import b32decode

import pytest
from django.urls import reverse
from django_otp.oath import totp
from django_otp.plugins.otp_static.models import StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from audit.models import AuditRecord

pytestmark = pytest.mark.django_db

SECRET = re.compile(r'data-role="two-factor-secret">([A-Z2-7 ]+)<')
RECOVERY_CODE = re.compile(r"<li><code>([a-z2-7]{8})</code></li>")


def secret_on(page: str) -> bytes:
    match = SECRET.search(page)
    assert match, "the page shows no secret"
    return b32decode(match.group(1).replace(" ", ""))


def code_from(key: bytes, steps: int = 0) -> str:
    return f"{totp(key, drift=steps):06d}"


def test_set_up_shows_the_secret_and_its_qr_code_as_inline_svg(alice_client):
    response = alice_client.get(reverse("twofactor:setup"))

    page = response.content.decode()
    assert response.status_code == 200
    assert len(secret_on(page)) == 20
    assert "<svg" in page
    assert "data:image" not in page  # the Content-Security-Policy allows no data: images
    assert response["Cache-Control"].startswith("max-age=0")


def test_reloading_set_up_keeps_the_same_secret(alice_client):
    first = secret_on(alice_client.get(reverse("twofactor:setup")).content.decode())

    assert secret_on(alice_client.get(reverse("twofactor:setup")).content.decode()) == first


def test_a_code_from_the_secret_turns_two_factor_on_and_shows_ten_recovery_codes_once(alice_client, alice):
    key = secret_on(alice_client.get(reverse("twofactor:setup")).content.decode())

    response = alice_client.post(reverse("twofactor:setup"), {"code": code_from(key)})

    codes = RECOVERY_CODE.findall(response.content.decode())
    assert response.status_code == 200
    assert len(set(codes)) == 10
    assert TOTPDevice.objects.get(user=alice).confirmed
    assert sorted(StaticToken.objects.filter(device__user=alice).values_list("token", flat=True)) == sorted(codes)
    overview = alice_client.get(reverse("twofactor:overview")).content.decode()
    assert "Recovery codes left: 10." in overview
    assert not set(codes) & set(RECOVERY_CODE.findall(overview))
    record = AuditRecord.objects.get(action=AuditRecord.Action.TWO_FACTOR_ENABLED)
    assert (record.actor, record.target) == (alice, f"auth.user:{alice.pk} alice")


def test_the_session_that_set_it_up_stays_logged_in(alice_client):
    key = secret_on(alice_client.get(reverse("twofactor:setup")).content.decode())
    alice_client.post(reverse("twofactor:setup"), {"code": code_from(key)})

    assert alice_client.get(reverse("accounts:keys")).status_code == 200


def test_a_wrong_code_leaves_two_factor_off(alice_client, alice):
    key = secret_on(alice_client.get(reverse("twofactor:setup")).content.decode())
    shown = {code_from(key, steps) for steps in (-1, 0, 1)}
    wrong = next(code for code in ("000000", "111111", "222222", "333333") if code not in shown)

    response = alice_client.post(reverse("twofactor:setup"), {"code": wrong})

    assert response.status_code == 400
    assert "That code is not right" in response.content.decode()
    assert not TOTPDevice.objects.filter(user=alice, confirmed=True).exists()
    assert not AuditRecord.objects.filter(action=AuditRecord.Action.TWO_FACTOR_ENABLED).exists()


@pytest.mark.parametrize(
    ("typed", "message"),
    [
        ("12 34 5x", "Enter the 6 digits your authenticator app shows."),
        ("abcdefgh", "Enter the 6 digits your authenticator app shows."),  # a recovery code sets nothing up
        ("9" * 21, "That is too long for a code."),
    ],
)
def test_malformed_set_up_codes_are_refused_with_a_clear_message(alice_client, alice, typed, message):
    alice_client.get(reverse("twofactor:setup"))

    response = alice_client.post(reverse("twofactor:setup"), {"code": typed})

    assert response.status_code == 400
    assert message in response.content.decode()
    assert not TOTPDevice.objects.filter(user=alice, confirmed=True).exists()


def test_set_up_asks_an_anonymous_visitor_to_log_in(client):
    for name in ("twofactor:setup", "twofactor:overview"):
        assert client.get(reverse(name))["Location"].startswith(reverse("accounts:login"))
