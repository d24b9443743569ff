"""Two-factor settings: new recovery codes, turning it off, and only one's own."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django_otp.plugins.otp_static.models import StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from audit.models import AuditRecord
from tests.twofactor.conftest import code_for, wrong_code_for
from twofactor.services import CodeRefused, code_check

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice_verified(client, alice, alice_2fa, steady_clock):
    """Alice's browser, logged in with her password and a code."""
    client.force_login(alice)
    client.post(reverse("twofactor:verify"), {"code": code_for(alice_2fa.device)})
    TOTPDevice.objects.filter(pk=alice_2fa.device.pk).update(last_t=-1)  # her next code may be the same
    return client


def test_turning_off_takes_a_current_code(alice_verified, alice, alice_2fa):
    wrong = alice_verified.post(reverse("twofactor:disable"), {"code": wrong_code_for(alice_2fa.device)})
    assert wrong.status_code == 400
    assert TOTPDevice.objects.filter(user=alice).exists()
    TOTPDevice.objects.filter(user=alice).update(throttling_failure_timestamp=None, throttling_failure_count=0)

    response = alice_verified.post(reverse("twofactor:disable"), {"code": code_for(alice_2fa.device)})

    assert response["Location"] == reverse("twofactor:overview")
    assert not TOTPDevice.objects.filter(user=alice).exists()
    assert not StaticToken.objects.filter(device__user=alice).exists()
    assert "Off: your password alone logs you in." in alice_verified.get(response["Location"]).content.decode()
    assert AuditRecord.objects.get(action=AuditRecord.Action.TWO_FACTOR_DISABLED).actor == alice


def test_turning_off_with_a_recovery_code_works(alice_verified, alice, alice_2fa):
    alice_verified.post(reverse("twofactor:disable"), {"code": alice_2fa.codes[0]})

    assert not TOTPDevice.objects.filter(user=alice).exists()


def test_new_recovery_codes_replace_the_old_ones(alice_verified, alice, alice_2fa):
    response = alice_verified.post(reverse("twofactor:recovery_codes"))

    page = response.content.decode()
    new = list(StaticToken.objects.filter(device__user=alice).values_list("token", flat=True))
    assert len(new) == 10
    assert all(code in page for code in new)
    assert not set(alice_2fa.codes) & set(new)
    with pytest.raises(CodeRefused):
        code_check(user=alice, code=alice_2fa.codes[0])
    assert AuditRecord.objects.filter(action=AuditRecord.Action.RECOVERY_CODES_REGENERATED).count() == 2


def test_bob_cannot_see_or_alter_alices_two_factor(bob_client, alice, alice_2fa, steady_clock):
    overview = bob_client.get(reverse("twofactor:overview")).content.decode()
    assert "Off: your password alone logs you in." in overview

    refused = bob_client.post(reverse("twofactor:disable"), {"code": code_for(alice_2fa.device)})
    bob_client.post(reverse("twofactor:recovery_codes"))
    bob_client.post(reverse("twofactor:setup"), {"code": code_for(alice_2fa.device)})

    assert refused.status_code == 400
    assert TOTPDevice.objects.filter(user=alice, confirmed=True).count() == 1
    assert sorted(StaticToken.objects.filter(device__user=alice).values_list("token", flat=True)) == sorted(
        alice_2fa.codes
    )
    assert not AuditRecord.objects.filter(action=AuditRecord.Action.TWO_FACTOR_DISABLED).exists()


def test_the_settings_page_asks_for_the_code_first_in_a_session_without_one(client, alice, alice_2fa):
    client.force_login(alice)

    for response in (client.get(reverse("twofactor:overview")), client.post(reverse("twofactor:recovery_codes"))):
        assert response["Location"].startswith(reverse("twofactor:verify"))
    assert sorted(StaticToken.objects.filter(device__user=alice).values_list("token", flat=True)) == sorted(
        alice_2fa.codes
    )
