"""Logging in with an LDAP directory: Debian's slapd in a process of its own (tests.support.
ldap_server), the log-in page's form, and the ldap_group mappings applied at every log-in."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from axes.models import AccessAttempt
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from accounts.models import DEFAULT_PLAN, Plan
from accounts.services import account_for, api_key_authenticate, api_key_create
from audit.models import AuditRecord
from sso.models import LDAP_GROUP_CLAIM, ClaimMapping
from tests.support import PASSWORD
from tests.support.ldap_server import (
    ADMINS_GROUP,
    GROUPS,
    INTERNS_GROUP,
    PEOPLE,
    SERVICE_DN,
    SERVICE_PASSWORD,
    SUFFIX,
    USERS,
    Directory,
    ldap_server,
)
from tests.support.livesite import free_port

pytestmark = pytest.mark.django_db

ADA_PASSWORD = USERS["ada"][0]
BOB_PASSWORD = USERS["bob"][0]


@pytest.fixture(scope="module")
def directory() -> Iterator[Directory]:
    with ldap_server() as server:
        yield server


@pytest.fixture
def ldap_site(settings, directory) -> Directory:
    """This site pointed at the directory, as CHAT_LDAP_* would (chatsite/settings.py)."""
    settings.CHAT_LDAP_SERVER_URI = directory.uri
    settings.CHAT_LDAP_BIND_DN = SERVICE_DN
    settings.CHAT_LDAP_BIND_PASSWORD = SERVICE_PASSWORD
    settings.CHAT_LDAP_USER_SEARCH_BASE = PEOPLE
    settings.CHAT_LDAP_USER_FILTER = "(uid=%(user)s)"
    settings.CHAT_LDAP_GROUP_SEARCH_BASE = GROUPS
    settings.CHAT_LDAP_GROUP_TYPE = "groupOfNames"
    settings.CHAT_LDAP_START_TLS = False
    settings.AUTHENTICATION_BACKENDS = [*settings.AUTHENTICATION_BACKENDS, "ldap_login.backends.LdapBackend"]
    return directory


@pytest.fixture
def interns() -> Plan:
    return Plan.objects.create(name="interns", requests_per_minute=3)


@pytest.fixture
def mappings(interns) -> None:
    # Written as AD writes DNs, in other case than the directory's: DNs match regardless.
    ClaimMapping.objects.create(
        claim=LDAP_GROUP_CLAIM, value="CN=Chat-Admins, OU=Groups,DC=example,DC=com", is_staff=True, order=0
    )
    ClaimMapping.objects.create(claim=LDAP_GROUP_CLAIM, value=INTERNS_GROUP, plan=interns, order=10)


@pytest.fixture
def groups_restored(ldap_site) -> Iterator[Directory]:
    """The directory's memberships as seeded, again after a test that changes them."""
    yield ldap_site
    for uid, (*_, groups) in USERS.items():
        for group in groups:
            ldap_site.add_member(group, uid)


def log_in(client: Client, username: str, password: str):
    return client.post(reverse("accounts:login"), {"username": username, "password": password})


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def test_a_directory_user_logs_in_and_is_made_with_the_plan_and_staff_status_of_their_groups(
    client, ldap_site, mappings, interns
):
    response = log_in(client, "ada", ADA_PASSWORD)

    assert response.status_code == 302
    assert logged_in(client)
    ada = User.objects.get(username="ada")
    assert (ada.first_name, ada.last_name, ada.email) == ("Ada", "Lovelace", "ada@example.com")
    assert not ada.has_usable_password()  # the directory keeps the password
    assert ada.is_staff and not ada.is_superuser
    assert account_for(ada).plan == interns
    actions = set(AuditRecord.objects.filter(actor=ada).values_list("action", flat=True))
    # The groups moved the new user off the default plan and made them staff: audited too.
    assert actions == {AuditRecord.Action.SIGNUP, AuditRecord.Action.CLAIMS_APPLIED, AuditRecord.Action.LOGIN}


def test_a_member_of_no_mapped_group_for_staff_is_not_staff(client, ldap_site, mappings, interns):
    assert log_in(client, "bob", BOB_PASSWORD).status_code == 302

    bob = User.objects.get(username="bob")
    assert not bob.is_staff
    assert account_for(bob).plan == interns


def test_a_wrong_password_is_refused_and_counted_by_axes(client, ldap_site, mappings):
    response = log_in(client, "ada", "not-the-directory-password")

    assert response.status_code == 200
    assert "correct username and password" in response.content.decode()
    assert not logged_in(client)
    assert not User.objects.filter(username="ada").exists()
    assert AccessAttempt.objects.get(username="ada").failures_since_start == 1
    assert AuditRecord.objects.filter(action=AuditRecord.Action.LOGIN_FAILED, target="username:ada").exists()


def test_wrong_passwords_lock_a_directory_user_out_like_any_other(client, ldap_site):
    for number in range(5):  # CHAT_LOGIN_FAILURE_LIMIT's default
        log_in(client, "ada", f"guess-{number}")

    response = log_in(client, "ada", ADA_PASSWORD)

    assert response.status_code == 429
    assert not logged_in(client)


def test_an_unknown_user_is_refused(client, ldap_site, mappings):
    response = log_in(client, "mallory", "any-password")

    assert response.status_code == 200
    assert not logged_in(client)
    assert not User.objects.filter(username="mallory").exists()


def test_a_user_removed_from_a_group_loses_its_plan_at_the_next_log_in(client, groups_restored, mappings, interns):
    log_in(client, "bob", BOB_PASSWORD)
    bob = User.objects.get(username="bob")
    _, plain = api_key_create(user=bob, name="laptop")
    key = api_key_authenticate(plain)
    assert key is not None and key.user.account.plan == interns  # remembered now
    client.logout()

    groups_restored.remove_member(INTERNS_GROUP, "bob")
    assert log_in(client, "bob", BOB_PASSWORD).status_code == 302

    assert account_for(User.objects.get(username="bob")).plan.name == DEFAULT_PLAN
    key = api_key_authenticate(plain)
    assert key is not None and key.user.account.plan.name == DEFAULT_PLAN  # the API keys too, at once


def test_a_user_removed_from_the_admins_group_is_staff_no_more_at_the_next_log_in(client, groups_restored, mappings):
    log_in(client, "ada", ADA_PASSWORD)
    assert User.objects.get(username="ada").is_staff
    client.logout()

    groups_restored.remove_member(ADMINS_GROUP, "ada")
    log_in(client, "ada", ADA_PASSWORD)

    assert logged_in(client)
    assert not User.objects.get(username="ada").is_staff


def test_without_mappings_plans_and_staff_status_are_left_as_the_admin_set_them(client, ldap_site, interns):
    ada = User.objects.create_user("ada", is_staff=True)
    account = account_for(ada)
    account.plan = interns
    account.save()

    assert log_in(client, "ada", ADA_PASSWORD).status_code == 302

    ada.refresh_from_db()
    assert ada.is_staff
    assert account_for(ada).plan == interns


def test_a_local_account_of_the_same_name_becomes_the_directorys(client, ldap_site):
    User.objects.create_user("bob", password=PASSWORD)

    assert log_in(client, "bob", BOB_PASSWORD).status_code == 302

    bob = User.objects.get(username="bob")
    assert bob.email == "bob@example.com"
    assert not bob.has_usable_password()  # the old password here no longer works
    client.logout()
    assert log_in(client, "bob", PASSWORD).status_code == 200


def test_a_superuser_is_never_logged_in_by_the_directory(client, ldap_site, mappings):
    User.objects.create_superuser("ada", password=PASSWORD)

    assert log_in(client, "ada", ADA_PASSWORD).status_code == 200
    assert not logged_in(client)
    assert log_in(client, "ada", PASSWORD).status_code == 302  # the password kept here


def test_a_deactivated_user_is_refused_and_their_session_ends(client, ldap_site):
    log_in(client, "bob", BOB_PASSWORD)
    assert client.get(reverse("generation:chat")).status_code == 200
    User.objects.filter(username="bob").update(is_active=False)

    assert client.get(reverse("generation:chat")).status_code == 302  # back to the log-in page
    assert log_in(Client(), "bob", BOB_PASSWORD).status_code == 200


def test_a_directory_that_does_not_answer_refuses_the_log_in_quickly(client, ldap_site, settings):
    settings.CHAT_LDAP_SERVER_URI = f"ldap://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()

    response = log_in(client, "ada", ADA_PASSWORD)

    assert response.status_code == 200
    assert not logged_in(client)
    assert time.monotonic() - started < 10


def test_groups_that_cannot_be_read_refuse_the_log_in_and_change_nothing(client, ldap_site, settings, mappings):
    ada = User.objects.create_user("ada", is_staff=True)
    settings.CHAT_LDAP_GROUP_SEARCH_BASE = f"ou=nowhere,{SUFFIX}"  # the search fails: no such object

    response = log_in(client, "ada", ADA_PASSWORD)

    assert response.status_code == 200
    assert not logged_in(client)
    assert User.objects.get(pk=ada.pk).is_staff  # neither kept nor taken away on a failed read
