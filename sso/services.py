"""Single sign-on log-ins: the user behind a provider's identity (made at the first log-in,
or an existing one linked by a verified e-mail address), and the claim mappings applied at
every log-in."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from accounts.key_cache import api_access_changed
from accounts.models import DEFAULT_PLAN, Plan
from accounts.services import account_for
from audit.models import AuditRecord
from audit.services import audit_record, target_of
from sso.models import LDAP_GROUP_CLAIM, ClaimMapping, Identity
from sso.refusals import Refusal

USERNAME_MAX = User._meta.get_field("username").max_length or 150
NAME_MAX = 150


def sso_login_user(*, issuer: str, claims: Mapping[str, Any], request: HttpRequest | None = None) -> User:
    """The user for these verified claims, their plan and staff status set by the claim
    mappings; a Refusal when they may not log in (then nothing is kept)."""
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject:
        raise Refusal("no_subject", "The identity provider sent no subject (sub) for this log-in.")
    with transaction.atomic():
        identity = Identity.objects.select_related("user").filter(issuer=issuer, subject=subject).first()
        if identity is None:
            user = _linked_user(issuer, claims) or _new_user(claims, request=request)
            identity = Identity.objects.create(user=user, issuer=issuer, subject=subject)
        user = identity.user
        if not user.is_active:
            raise Refusal("inactive", "This account is deactivated. Ask an administrator.")
        claim_mappings_apply(user=user, claims=claims, among=ClaimMapping.objects.exclude(claim=LDAP_GROUP_CLAIM))
        identity.last_login_at = timezone.now()
        identity.save(update_fields=["last_login_at"])
    return user


def claim_mappings_apply(
    *, user: User, claims: Mapping[str, Any], among: QuerySet[ClaimMapping] | None = None
) -> dict[str, tuple[Any, Any]]:
    """Set the user's plan and staff status from the claim mappings; {field: (before, after)}.

    The plan is the first matching row's, else the default plan; staff status holds while any
    matching row gives it. Only what the table speaks of is managed (ClaimMapping's docstring);
    a superuser's staff status is never taken away here. `among`: the rows that speak for this
    log-in (an LDAP log-in's: the ldap_group rows, ldap_login.services); every row unless given.
    """
    mappings = list((ClaimMapping.objects.all() if among is None else among).select_related("plan"))
    matched = [mapping for mapping in mappings if mapping.matches(claims)]
    changes: dict[str, tuple[Any, Any]] = {}
    if any(mapping.plan_id for mapping in mappings):
        plan = next((mapping.plan for mapping in matched if mapping.plan is not None), None)
        if plan is None:
            plan, _ = Plan.objects.get_or_create(name=DEFAULT_PLAN)
        account = account_for(user)
        if account.plan_id != plan.pk:
            changes["plan"] = (account.plan.name, plan.name)
            account.plan = plan
            account.save(update_fields=["plan"])
    if any(mapping.is_staff for mapping in mappings) and not user.is_superuser:
        staff = any(mapping.is_staff for mapping in matched)
        if user.is_staff != staff:
            changes["is_staff"] = (user.is_staff, staff)
            user.is_staff = staff
            user.save(update_fields=["is_staff"])
    if changes:
        api_access_changed()  # the plan's limits and models apply to the user's API keys at once
        # The identity provider's groups decided it: the user is the actor, as for a sign-up.
        audit_record(
            action=AuditRecord.Action.CLAIMS_APPLIED, actor=user, target=target_of(user, user.username), changes=changes
        )
    return changes


def _linked_user(issuer: str, claims: Mapping[str, Any]) -> User | None:
    """The existing user with the claims' e-mail address, only when the provider verified it."""
    email = claims.get("email")
    if not isinstance(email, str) or not email or not _verified(claims.get("email_verified")):
        return None
    users = list(User.objects.filter(email__iexact=email)[:2])
    if not users:
        return None
    if len(users) > 1:
        raise Refusal(
            "email_ambiguous",
            "Several accounts here have this e-mail address, so none was linked. Ask an administrator.",
        )
    user = users[0]
    if user.is_superuser:
        # The break-glass account stays a password account, out of the provider's reach.
        raise Refusal(
            "superuser",
            "The account with this e-mail address is a superuser's, which single sign-on does not take over.",
        )
    if Identity.objects.filter(user=user, issuer=issuer).exists():
        raise Refusal(
            "linked_elsewhere", "The account with this e-mail address is linked to another identity at the provider."
        )
    return user


def _new_user(claims: Mapping[str, Any], *, request: HttpRequest | None) -> User:
    email = claims.get("email")
    user = User(
        username=_free_username(claims),
        # An address the provider did not verify is not stored: password resets go to it.
        email=email if isinstance(email, str) and _verified(claims.get("email_verified")) else "",
        first_name=str(claims.get("given_name") or "")[:NAME_MAX],
        last_name=str(claims.get("family_name") or "")[:NAME_MAX],
    )
    user.set_unusable_password()
    user.save()
    account_for(user)
    audit_record(action=AuditRecord.Action.SIGNUP, actor=user, target=target_of(user, user.username), request=request)
    return user


def _free_username(claims: Mapping[str, Any]) -> str:
    email = claims.get("email")
    wanted = claims.get("preferred_username") or (email.partition("@")[0] if isinstance(email, str) else "")
    base = re.sub(r"[^\w.@+-]", "", str(wanted or claims["sub"]))[: USERNAME_MAX - 8] or "user"
    username, number = base, 1
    while User.objects.filter(username__iexact=username).exists():
        number += 1
        username = f"{base}-{number}"
    return username


def _verified(value: Any) -> bool:
    # Some providers send the boolean as a string.
    return value is True or value == "true"
