"""Two-factor required: per plan, and for staff when CHAT_2FA_STAFF=1."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django_otp.plugins.otp_totp.models import TOTPDevice

from accounts.models import Plan
from accounts.services import account_for
from tests.support import PASSWORD
from tests.twofactor.conftest import code_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def strict_plan(alice) -> Plan:
    plan = Plan.objects.create(name="strict", require_two_factor=True)
    account = account_for(alice)
    account.plan = plan
    account.save()
    return plan


def log_in(client, username: str = "alice"):
    return client.post(reverse("accounts:login"), {"username": username, "password": PASSWORD})


def test_a_plan_that_requires_two_factor_sends_its_users_to_set_it_up_first(client, alice, strict_plan):
    chat = client.get(log_in(client)["Location"])

    assert chat["Location"] == reverse("twofactor:setup") + "?next=%2Fchat%2F"
    assert client.get(reverse("accounts:keys"))["Location"].startswith(reverse("twofactor:setup"))
    page = client.get(reverse("twofactor:setup")).content.decode()
    assert "Your account requires two-factor log-in" in page
    assert "Not now" not in page
    assert client.post(reverse("accounts:logout")).status_code == 302


def test_once_set_up_the_required_user_reaches_the_chat(client, alice, strict_plan, steady_clock):
    log_in(client)
    client.get(reverse("twofactor:setup") + "?next=/chat/")
    device = TOTPDevice.objects.get(user=alice)

    response = client.post(reverse("twofactor:setup") + "?next=/chat/", {"code": code_for(device)})

    assert 'href="/chat/">Continue' in response.content.decode()
    assert client.get(reverse("generation:chat")).status_code == 200


def test_a_required_user_cannot_turn_two_factor_off(client, alice, alice_2fa, strict_plan, steady_clock):
    log_in(client)
    client.post(reverse("twofactor:verify"), {"code": code_for(alice_2fa.device)})

    response = client.post(reverse("twofactor:disable"), {"code": alice_2fa.codes[0]})

    assert response.status_code == 403
    assert "it can't be turned off" in response.content.decode()
    assert TOTPDevice.objects.filter(user=alice, confirmed=True).exists()


def test_htmx_requests_of_a_required_user_are_redirected_whole(client, alice, strict_plan):
    log_in(client)

    response = client.get(reverse("generation:chat"), HTTP_HX_REQUEST="true")

    assert response["HX-Redirect"] == reverse("twofactor:setup")


def test_staff_must_set_it_up_when_chat_2fa_staff_is_on(client, admin_user, settings):
    settings.CHAT_2FA_STAFF = True

    client.post(reverse("admin:login"), {"username": "admin", "password": "password"})

    assert client.get(reverse("admin:index"))["Location"].startswith(reverse("twofactor:setup"))
    assert client.get(reverse("generation:chat"))["Location"].startswith(reverse("twofactor:setup"))


def test_staff_are_not_required_to_without_the_setting(client, admin_user):
    client.post(reverse("admin:login"), {"username": "admin", "password": "password"})

    assert client.get(reverse("admin:index")).status_code == 200
