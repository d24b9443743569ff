from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from audit.admin import AuditedAdmin
from sso.models import LDAP_GROUP_CLAIM, ClaimMapping, Identity


@admin.register(ClaimMapping)
class ClaimMappingAdmin(AuditedAdmin):
    """Claim values that give a plan or staff status, applied at every single sign-on log-in."""

    list_display = ["claim", "value", "plan", "is_staff", "order"]
    list_filter = ["claim", "plan", "is_staff"]
    search_fields = ["claim", "value"]

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        # The model's help texts speak of tokens; rows for LDAP groups (ldap_login) are written so.
        kwargs.setdefault(
            "help_texts",
            {
                "claim": "The claim's name in the ID token or user info, e.g. groups; "
                f"{LDAP_GROUP_CLAIM}: an LDAP directory's group (LDAP log-ins).",
                "value": "Matches a claim equal to this, or a list claim holding it (Keycloak's groups: /interns); "
                f"for {LDAP_GROUP_CLAIM}, the group's DN: CN=Chat Admins,OU=Groups,DC=example,DC=com.",
            },
        )
        return super().get_form(request, obj, change, **kwargs)


@admin.register(Identity)
class IdentityAdmin(AuditedAdmin):
    """Users' identities at the provider. Deleting one unlinks it: the next log-in links or makes a user again."""

    list_display = ["user", "subject", "issuer", "created_at", "last_login_at"]
    search_fields = ["user__username", "user__email", "subject"]
    list_select_related = ["user"]
    readonly_fields = ["user", "issuer", "subject", "created_at", "last_login_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
