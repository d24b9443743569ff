"""Who logs in through the OpenID Connect provider, and what their claims grant."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.db import models

from accounts.models import Plan

# Rows of this claim name LDAP groups by DN (ldap_login): LDAP log-ins apply them, and only them;
# single sign-on log-ins apply every other row.
LDAP_GROUP_CLAIM = "ldap_group"


class ClaimMapping(models.Model):
    """A claim value that gives a plan, staff status or both, applied at every SSO log-in.

    A user's plan is the plan of the first matching row (by order, then id), else the default
    plan; they are staff while any matching row says so. The table decides only what it speaks
    of: with no row giving a plan, plans are left as the admin set them; with no row giving
    staff status, so is staff status.
    """

    claim = models.CharField(
        max_length=100, default="groups", help_text="The claim's name in the ID token or user info, e.g. groups."
    )
    value = models.CharField(
        max_length=255,
        help_text="Matches a claim equal to this, or a list claim holding it (Keycloak's groups: /interns).",
    )
    plan = models.ForeignKey(
        Plan,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="claim_mappings",
        help_text="The plan this gives. Blank: no plan from this row.",
    )
    is_staff = models.BooleanField("staff", default=False, help_text="Staff status (the admin) while it matches.")
    order = models.PositiveIntegerField(default=0, help_text="Lower first: the first matching row's plan counts.")

    class Meta:
        ordering = ["order", "id"]
        constraints = [models.UniqueConstraint(fields=["claim", "value"], name="sso_claim_mapping_unique")]

    def __str__(self) -> str:
        return f"{self.claim} = {self.value}"

    def matches(self, claims: Mapping[str, Any]) -> bool:
        found = claims.get(self.claim)
        if isinstance(found, list | tuple):
            return any(_as_text(item) == self.value for item in found)
        return found is not None and _as_text(found) == self.value


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class Identity(models.Model):
    """A user's account at the provider: its issuer and subject (`sub`), which never change."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identities")
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    last_login_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "identities"
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="sso_identity_unique")]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"
