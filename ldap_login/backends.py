"""django-auth-ldap's backend, configured by the CHAT_LDAP_* settings (docs/operations.md:
LDAP), applying the ldap_group mappings at every log-in (ldap_login.services)."""

from __future__ import annotations

import logging
from typing import Any

import ldap
from django.conf import settings
from django.contrib.auth.models import User
from django_auth_ldap.backend import LDAPBackend
from django_auth_ldap.config import GroupOfNamesType, LDAPSearch, NestedActiveDirectoryGroupType, PosixGroupType

from ldap_login.services import ldap_groups_apply, ldap_user_created

logger = logging.getLogger(__name__)

# CHAT_LDAP_GROUP_TYPE: how a user's groups are found, and which entries are groups.
GROUP_TYPES: dict[str, tuple[Any, str]] = {
    "groupOfNames": (GroupOfNamesType, "(objectClass=groupOfNames)"),
    "posix": (PosixGroupType, "(objectClass=posixGroup)"),
    # Nested: a member of a group inside the mapped group is in it too, as AD's own checks say.
    "activedirectory": (NestedActiveDirectoryGroupType, "(objectClass=group)"),
}


def directory_settings() -> dict[str, Any]:
    """django-auth-ldap's settings (AUTH_LDAP_* without the prefix) from the CHAT_LDAP_* ones;
    an AUTH_LDAP_* setting of a settings module of one's own still wins over these."""
    group_type, group_filter = GROUP_TYPES[settings.CHAT_LDAP_GROUP_TYPE]
    group_base = settings.CHAT_LDAP_GROUP_SEARCH_BASE
    return {
        "SERVER_URI": settings.CHAT_LDAP_SERVER_URI,
        "BIND_DN": settings.CHAT_LDAP_BIND_DN,
        "BIND_PASSWORD": settings.CHAT_LDAP_BIND_PASSWORD,
        "START_TLS": settings.CHAT_LDAP_START_TLS,
        "USER_SEARCH": LDAPSearch(
            settings.CHAT_LDAP_USER_SEARCH_BASE, ldap.SCOPE_SUBTREE, settings.CHAT_LDAP_USER_FILTER
        ),
        "GROUP_SEARCH": LDAPSearch(group_base, ldap.SCOPE_SUBTREE, group_filter) if group_base else None,
        "GROUP_TYPE": group_type(),
        "USER_ATTR_MAP": {"first_name": "givenName", "last_name": "sn", "email": "mail"},
        "CONNECTION_OPTIONS": {
            # Referrals off: libldap would follow AD's referrals (to its DNS zones) without
            # binding, and the search fails with "Operations error".
            ldap.OPT_REFERRALS: 0,
            # A directory that does not answer fails the log-in in seconds, not minutes.
            ldap.OPT_NETWORK_TIMEOUT: 5,
            ldap.OPT_TIMEOUT: 10,
        },
        # Group memberships are read afresh at every log-in (no cache): one left shows at once.
        "CACHE_TIMEOUT": 0,
    }


class LdapBackend(LDAPBackend):
    """A password the directory accepts logs its user in: made here at the first log-in (an
    unusable password here), their names and e-mail address and the group mappings renewed
    at every log-in. A superuser is never logged in this way: the break-glass account stays
    a password account, out of the directory's reach."""

    @property
    def default_settings(self) -> dict[str, Any]:
        return directory_settings()

    def get_or_build_user(self, username: str, ldap_user: Any) -> tuple[User, bool]:
        user, built = super().get_or_build_user(username, ldap_user)
        if user.is_superuser:
            logger.warning("ldap: %s is a superuser here, who logs in with the password kept here", username)
            raise ldap_user.AuthenticationFailed("a superuser here")
        ldap_user.chat_user_built = built
        return user, built

    def authenticate_ldap_user(self, ldap_user: Any, password: str) -> User | None:
        user: User | None = super().authenticate_ldap_user(ldap_user, password)
        if user is None or not user.is_active:
            return None  # as Django's ModelBackend does: a deactivated account does not log in
        if getattr(ldap_user, "chat_user_built", False):
            ldap_user_created(user=user, request=ldap_user._request)  # the request django-auth-ldap was given
        elif user.has_usable_password():
            # An account that was here before: the directory's password is its password from now on.
            logger.info("ldap: %s now logs in with the directory's password", user.get_username())
            user.set_unusable_password()
            user.save(update_fields=["password"])
        if self.settings.GROUP_SEARCH is not None:
            try:
                group_dns = ldap_user.group_dns
            except ldap.LDAPError as error:
                # Without them the mappings cannot be applied, and yesterday's staff status
                # must not outlive a group left today.
                logger.warning("ldap: the groups of %s could not be read: %s", user.get_username(), error)
                return None
            ldap_groups_apply(user=user, group_dns=group_dns)
        return user

    def get_user(self, user_id: int) -> User | None:
        # As Django's ModelBackend, a deactivated user is refused: their session ends at their next request.
        user: User | None = super().get_user(user_id)
        return user if user is not None and user.is_active else None
