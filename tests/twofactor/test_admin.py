"""The admin asks staff with an authenticator for a code; without one, a superuser still gets in."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib import admin
from django.core.management import call_command
from django.urls import reverse

from tests.twofactor.conftest import authenticator_for, code_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_device(admin_user):
    device, _ = authenticator_for(admin_user)
    return device


def admin_log_in(client):
    return client.post(
        reverse("admin:login") + "?next=/admin/", {"username": "admin", "password": "password", "next": "/admin/"}
    )


def test_the_admin_log_in_asks_for_the_code_after_the_password(client, admin_device, steady_clock):
    response = admin_log_in(client)

    assert response["Location"] == reverse("twofactor:verify")
    assert client.get(reverse("admin:index"))["Location"].startswith(reverse("admin:login"))

    assert client.post(reverse("twofactor:verify"), {"code": code_for(admin_device)})["Location"] == "/admin/"
    assert client.get(reverse("admin:index")).status_code == 200


def test_an_admin_session_without_the_code_is_not_let_in(client, admin_user, admin_device):
    client.force_login(admin_user)

    response = client.get(reverse("admin:index"))

    assert response["Location"].startswith(reverse("twofactor:verify"))


def test_the_admin_site_itself_refuses_an_unverified_session_with_an_authenticator(rf, admin_user, admin_device):
    request = rf.get("/admin/")
    request.user = admin_user
    admin_user.is_verified = lambda: False

    assert not admin.site.has_permission(request)


def test_a_superuser_without_an_authenticator_logs_in_with_the_password_alone(client, admin_user):
    response = admin_log_in(client)

    assert response["Location"] == "/admin/"
    assert client.get(reverse("admin:index")).status_code == 200


def test_an_admin_who_lost_the_phone_gets_in_once_with_a_code_from_addstatictoken(client, admin_device):
    out = StringIO()
    call_command("addstatictoken", "admin", stdout=out)
    code = out.getvalue().strip()
    admin_log_in(client)

    assert client.post(reverse("twofactor:verify"), {"code": code})["Location"] == "/admin/"
    client.post(reverse("admin:logout"))
    admin_log_in(client)
    assert client.post(reverse("twofactor:verify"), {"code": code}).status_code == 400
