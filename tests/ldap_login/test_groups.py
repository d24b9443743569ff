"""Directory groups to plans and staff status: the ldap_group rows, matched as DNs."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from accounts.models import DEFAULT_PLAN, Plan
from accounts.services import account_for
from ldap_login.services import dn_normalized, ldap_groups_apply
from sso.models import LDAP_GROUP_CLAIM, ClaimMapping
from sso.services import claim_mappings_apply

ADMINS = "CN=Chat Admins,OU=Groups,DC=example,DC=com"


@pytest.mark.parametrize(
    "same",
    [
        "CN=Chat Admins,OU=Groups,DC=example,DC=com",
        "cn=chat admins,ou=groups,dc=example,dc=com",
        "cn=Chat Admins, ou=Groups, dc=Example, dc=COM",
        " CN=Chat Admins,OU=Groups,DC=example,DC=com ",
    ],
)
def test_dns_are_one_group_whatever_their_case_and_spaces(same):
    assert dn_normalized(same) == dn_normalized(ADMINS)


def test_other_groups_and_escaped_commas_are_other_dns():
    assert dn_normalized("CN=Chat Users,OU=Groups,DC=example,DC=com") != dn_normalized(ADMINS)
    assert dn_normalized(r"CN=Admins\, Chat,OU=Groups,DC=example,DC=com") != dn_normalized(
        "CN=Admins,CN=Chat,OU=Groups,DC=example,DC=com"
    )


def test_what_is_not_a_dn_is_compared_as_written_but_for_case():
    assert dn_normalized("Chat Admins") == "chat admins"


@pytest.fixture
def interns(db) -> Plan:
    return Plan.objects.create(name="interns")


@pytest.fixture
def ada(db) -> User:
    return User.objects.create_user("ada")


def test_the_first_matching_groups_plan_counts_and_any_staff_group_gives_staff(ada, interns):
    seniors = Plan.objects.create(name="seniors")
    ClaimMapping.objects.create(claim=LDAP_GROUP_CLAIM, value=ADMINS, is_staff=True, order=0)
    ClaimMapping.objects.create(claim=LDAP_GROUP_CLAIM, value="cn=seniors,dc=example,dc=com", plan=seniors, order=5)
    ClaimMapping.objects.create(claim=LDAP_GROUP_CLAIM, value="cn=interns,dc=example,dc=com", plan=interns, order=10)

    changes = ldap_groups_apply(
        user=ada, group_dns=["cn=interns,dc=example,dc=com", "cn=chat admins,ou=groups,dc=example,dc=com"]
    )

    assert changes == {"plan": (DEFAULT_PLAN, "interns"), "is_staff": (False, True)}
    assert account_for(ada).plan == interns
    assert User.objects.get(pk=ada.pk).is_staff


def test_in_no_mapped_group_the_user_is_back_on_the_default_plan_and_not_staff(ada, interns):
    ClaimMapping.objects.create(claim=LDAP_GROUP_CLAIM, value=ADMINS, is_staff=True)
    ClaimMapping.objects.create(claim=LDAP_GROUP_CLAIM, value="cn=interns,dc=example,dc=com", plan=interns)
    ldap_groups_apply(user=ada, group_dns=[ADMINS, "cn=interns,dc=example,dc=com"])

    ldap_groups_apply(user=ada, group_dns=[])

    assert account_for(ada).plan.name == DEFAULT_PLAN
    assert not User.objects.get(pk=ada.pk).is_staff


def test_single_sign_on_rows_never_decide_for_a_directory_log_in(ada, interns):
    ClaimMapping.objects.create(claim="groups", value="/interns", plan=interns, is_staff=True)
    account = account_for(ada)
    account.plan = interns
    account.save()

    assert ldap_groups_apply(user=ada, group_dns=[ADMINS]) == {}
    assert account_for(ada).plan == interns


def test_directory_rows_never_decide_for_a_single_sign_on_log_in(ada, interns):
    ClaimMapping.objects.create(claim=LDAP_GROUP_CLAIM, value=ADMINS, plan=interns)
    account = account_for(ada)
    account.plan = interns
    account.save()

    sso_rows = ClaimMapping.objects.exclude(claim=LDAP_GROUP_CLAIM)  # as sso.services.sso_login_user applies them
    assert claim_mappings_apply(user=ada, claims={"groups": ["/staff"]}, among=sso_rows) == {}
    assert account_for(ada).plan == interns


def test_the_admins_claim_mapping_form_says_how_to_write_an_ldap_group(admin_client):
    page = admin_client.get(reverse("admin:sso_claimmapping_add")).content.decode()

    assert "ldap_group: an LDAP directory" in page
    assert "CN=Chat Admins,OU=Groups,DC=example,DC=com" in page
