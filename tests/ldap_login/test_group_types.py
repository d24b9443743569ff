"""CHAT_LDAP_GROUP_TYPE against a real slapd (tests.support.ldap_server) for each kind of
directory: RFC 2307 posixGroup (memberUid, and a primary group by gidNumber), and Active
Directory's `user` and `group` classes (ad.schema, beside this file, under AD's own OIDs),
users found by sAMAccountName, with a group inside a group. groupOfNames is tested in
tests/e2e/test_ldap.py; a guest who logs in with a directory password keeps the chat."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from accounts.models import DEFAULT_PLAN, Plan
from accounts.services import account_for
from audit.models import AuditRecord
from generation.models import Conversation
from sso.models import LDAP_GROUP_CLAIM, ClaimMapping
from tests.support.chat import HTMX, eager_engine, fast_engine_run_eagerly
from tests.support.ldap_server import (
    GROUPS,
    PEOPLE,
    SCHEMA_NAMES,
    SERVICE_DN,
    SERVICE_PASSWORD,
    Directory,
    base_entries,
    ldap_server,
)

__all__ = ["eager_engine", "fast_engine_run_eagerly"]  # fixtures, used by name

pytestmark = pytest.mark.django_db

# uid: (password, given name, surname, primary gidNumber)
POSIX_USERS = {
    "ada": ("ada-directory-password", "Ada", "Lovelace", 5002),  # interns by her primary group alone
    "bob": ("bob-directory-password", "Bob", "Builder", 5000),
    "cy": ("cy-directory-password", "Cy", "Twombly", 5000),
}
# cn: (gidNumber, memberUid values)
POSIX_GROUPS = {"users": (5000, []), "chat-admins": (5001, ["ada"]), "interns": (5002, ["bob"])}


def posix_ldif() -> str:
    entries = base_entries()
    for number, (uid, (password, given, surname, gid)) in enumerate(POSIX_USERS.items()):
        entries.append(
            f"dn: uid={uid},{PEOPLE}\nobjectClass: inetOrgPerson\nobjectClass: posixAccount\nuid: {uid}\n"
            f"cn: {given} {surname}\ngivenName: {given}\nsn: {surname}\nmail: {uid}@example.com\n"
            f"uidNumber: {10_000 + number}\ngidNumber: {gid}\nhomeDirectory: /home/{uid}\nuserPassword: {password}"
        )
    for cn, (gid, members) in POSIX_GROUPS.items():
        lines = [f"dn: cn={cn},{GROUPS}", "objectClass: posixGroup", f"cn: {cn}", f"gidNumber: {gid}"]
        entries.append("\n".join(lines + [f"memberUid: {uid}" for uid in members]))
    return "\n\n".join(entries) + "\n"


# Active Directory: people found by sAMAccountName, DNs named by cn, groups of class `group`.
AD_USERS = {
    "ada": ("ada-directory-password", "Ada", "Lovelace"),
    "bob": ("bob-directory-password", "Bob", "Builder"),
}
AD_ADMINS = f"CN=Chat Admins,{GROUPS}"
AD_PLATFORM = f"CN=Platform Team,{GROUPS}"  # inside Chat Admins
AD_INTERNS = f"CN=Interns,{GROUPS}"
AD_GROUP_MEMBERS = {
    AD_ADMINS: [AD_PLATFORM],
    AD_PLATFORM: [f"CN=Ada Lovelace,{PEOPLE}"],
    AD_INTERNS: [f"CN=Bob Builder,{PEOPLE}"],
}
# A groupOfNames holding bob: not a group to AD's group type, whose search asks for objectClass=group.
NOT_AN_AD_GROUP = f"cn=decoy,{GROUPS}"
GLOBAL_SECURITY_GROUP = -2147483646
# AD's classes and attributes as slapd knows them here: a schema file beside this one.
AD_SCHEMA = str(Path(__file__).with_name("ad"))


def ad_ldif() -> str:
    entries = base_entries()
    for account, (password, given, surname) in AD_USERS.items():
        entries.append(
            f"dn: CN={given} {surname},{PEOPLE}\nobjectClass: user\ncn: {given} {surname}\n"
            f"sAMAccountName: {account}\ngivenName: {given}\nsn: {surname}\nmail: {account}@example.com\n"
            f"userPassword: {password}"
        )
    for group, members in AD_GROUP_MEMBERS.items():
        cn = group.split(",")[0][3:]
        lines = [f"dn: {group}", "objectClass: group", f"cn: {cn}", f"groupType: {GLOBAL_SECURITY_GROUP}"]
        entries.append("\n".join(lines + [f"member: {member}" for member in members]))
    entries.append(f"dn: {NOT_AN_AD_GROUP}\nobjectClass: groupOfNames\ncn: decoy\nmember: CN=Bob Builder,{PEOPLE}")
    return "\n\n".join(entries) + "\n"


@pytest.fixture(scope="module")
def posix_directory() -> Iterator[Directory]:
    with ldap_server(ldif=posix_ldif()) as server:
        yield server


@pytest.fixture(scope="module")
def ad_directory() -> Iterator[Directory]:
    with ldap_server(schemas=(*SCHEMA_NAMES, AD_SCHEMA), ldif=ad_ldif()) as server:
        yield server


def point_at(settings, directory: Directory, *, group_type: str, user_filter: str) -> None:
    """This site pointed at `directory`, as CHAT_LDAP_* would (chatsite/settings.py)."""
    settings.CHAT_LDAP_SERVER_URI = directory.uri
    settings.CHAT_LDAP_BIND_DN = SERVICE_DN
    settings.CHAT_LDAP_BIND_PASSWORD = SERVICE_PASSWORD
    settings.CHAT_LDAP_USER_SEARCH_BASE = PEOPLE
    settings.CHAT_LDAP_USER_FILTER = user_filter
    settings.CHAT_LDAP_GROUP_SEARCH_BASE = GROUPS
    settings.CHAT_LDAP_GROUP_TYPE = group_type
    settings.CHAT_LDAP_START_TLS = False
    settings.AUTHENTICATION_BACKENDS = [*settings.AUTHENTICATION_BACKENDS, "ldap_login.backends.LdapBackend"]


@pytest.fixture
def posix_site(settings, posix_directory) -> Directory:
    point_at(settings, posix_directory, group_type="posix", user_filter="(uid=%(user)s)")
    return posix_directory


@pytest.fixture
def ad_site(settings, ad_directory) -> Directory:
    point_at(settings, ad_directory, group_type="activedirectory", user_filter="(sAMAccountName=%(user)s)")
    return ad_directory


@pytest.fixture
def interns() -> Plan:
    return Plan.objects.create(name="interns")


def log_in(client: Client, username: str, password: str):
    return client.post(reverse("accounts:login"), {"username": username, "password": password})


def staff_and_plan(username: str) -> tuple[bool, str]:
    user = User.objects.get(username=username)
    return user.is_staff, account_for(user).plan.name


def test_posix_groups_count_by_member_uid_and_by_primary_gid_number(client, posix_site, interns):
    ClaimMapping.objects.create(claim=LDAP_GROUP_CLAIM, value=f"cn=chat-admins,{GROUPS}", is_staff=True)
    ClaimMapping.objects.create(claim=LDAP_GROUP_CLAIM, value=f"CN=Interns,{GROUPS.upper()}", plan=interns)

    for username in POSIX_USERS:
        password = POSIX_USERS[username][0]
        assert log_in(Client(), username, password).status_code == 302, username

    assert staff_and_plan("ada") == (True, "interns")  # memberUid; interns by gidNumber 5002
    assert staff_and_plan("bob") == (False, "interns")  # memberUid
    assert staff_and_plan("cy") == (False, DEFAULT_PLAN)  # only in users (5000), which no row maps


def test_the_wrong_group_type_finds_no_groups_and_maps_nothing(client, posix_site, settings, interns):
    settings.CHAT_LDAP_GROUP_TYPE = "groupOfNames"  # posixGroups have no `member`: none is found
    ClaimMapping.objects.create(claim=LDAP_GROUP_CLAIM, value=f"cn=chat-admins,{GROUPS}", is_staff=True)

    assert log_in(client, "ada", POSIX_USERS["ada"][0]).status_code == 302

    assert staff_and_plan("ada") == (False, DEFAULT_PLAN)


def test_active_directory_groups_count_through_a_group_inside_a_group(client, ad_site, interns):
    # The worked example of docs/operations.md: rows written as AD writes DNs.
    ClaimMapping.objects.create(
        claim=LDAP_GROUP_CLAIM, value="CN=Chat Admins,OU=Groups,DC=example,DC=com", is_staff=True
    )
    ClaimMapping.objects.create(claim=LDAP_GROUP_CLAIM, value="CN=Interns,OU=Groups,DC=example,DC=com", plan=interns)
    ClaimMapping.objects.create(claim=LDAP_GROUP_CLAIM, value=NOT_AN_AD_GROUP, is_staff=True, order=99)

    assert log_in(Client(), "ada", AD_USERS["ada"][0]).status_code == 302
    assert log_in(Client(), "bob", AD_USERS["bob"][0]).status_code == 302

    ada = User.objects.get(username="ada")
    assert (ada.first_name, ada.last_name, ada.email) == ("Ada", "Lovelace", "ada@example.com")
    assert staff_and_plan("ada") == (True, DEFAULT_PLAN)  # Chat Admins, through Platform Team
    assert staff_and_plan("bob") == (False, "interns")  # not staff: the decoy is no AD group


def test_an_active_directory_user_is_refused_a_wrong_password(client, ad_site):
    assert log_in(client, "ada", "not-the-directory-password").status_code == 200
    assert not User.objects.filter(username="ada").exists()


def test_a_guest_who_logs_in_with_a_directory_password_keeps_the_chat(settings, posix_site, eager_engine):
    settings.CHAT_GUEST = True
    guest_client = Client(REMOTE_ADDR="198.51.100.7")
    assert guest_client.post(reverse("accounts:guest_start")).status_code == 302
    assert (
        guest_client.post(reverse("generation:chat"), {"prompt": "Remember the lighthouse"}, **HTMX).status_code == 200
    )
    conversation = Conversation.objects.get()
    guest = conversation.user

    assert log_in(guest_client, "bob", POSIX_USERS["bob"][0]).status_code == 302

    bob = User.objects.get(username="bob")
    assert Conversation.objects.get(pk=conversation.pk).user == bob
    assert not User.objects.filter(pk=guest.pk).exists()
    assert AuditRecord.objects.filter(action=AuditRecord.Action.GUEST_ADOPTED, actor=bob).count() == 1
