"""LDAP log-ins: a user made at their first log-in, and the plan and staff status that their
directory groups give, by the ClaimMapping rows of claim ldap_group (sso.models), applied at
every log-in."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import ldap
import ldap.dn
from django.contrib.auth.models import User
from django.http import HttpRequest

from accounts.services import account_for
from audit.models import AuditRecord
from audit.services import audit_record, target_of
from sso.models import LDAP_GROUP_CLAIM, ClaimMapping
from sso.services import claim_mappings_apply


def ldap_user_created(*, user: User, request: HttpRequest | None) -> None:
    """A user the directory vouched for, new here: their account, and the sign-up in the trail."""
    account_for(user)
    audit_record(action=AuditRecord.Action.SIGNUP, actor=user, target=target_of(user, user.username), request=request)


def ldap_groups_apply(*, user: User, group_dns: Iterable[str]) -> dict[str, tuple[Any, Any]]:
    """Set the user's plan and staff status from the ldap_group rows and the DNs of the groups
    they are in now; {field: (before, after)}. A group left takes its plan at the next log-in."""
    rows = ClaimMapping.objects.filter(claim=LDAP_GROUP_CLAIM)
    held = {dn_normalized(dn) for dn in group_dns}
    # Rows are matched as DNs (no case, no spaces around the commas), then handed on as the
    # claim's values exactly as written, which claim_mappings_apply compares as text.
    matched = [row.value for row in rows if dn_normalized(row.value) in held]
    return claim_mappings_apply(user=user, claims={LDAP_GROUP_CLAIM: matched}, among=rows)


def dn_normalized(dn: str) -> str:
    """A DN compared as directories compare them: `CN=Chat Admins, OU=Groups,DC=example,DC=com`
    and `cn=chat admins,ou=groups,dc=example,dc=com` are one group. (Attribute values of the
    usual naming attributes, cn, ou, dc, uid, are case-insensitive, in OpenLDAP and in AD.)"""
    try:
        rdns = ldap.dn.str2dn(dn.strip())
    except ldap.DECODING_ERROR:
        return dn.strip().lower()  # not a DN: matched as written, but for case
    return ldap.dn.dn2str([sorted((kind.lower(), value.lower(), flags) for kind, value, flags in rdn) for rdn in rdns])
