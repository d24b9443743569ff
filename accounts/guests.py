"""A guest who logs in to an account keeps their chat, whatever the log-in: the password
form (an LDAP password too), single sign-on, the two-factor code page, the admin's.

Each of those ends in Django's login(), which flushes the session when its user changes,
and then sends `user_logged_in`: the one place every log-in passes, so the chat is moved
there (as audit.receivers records log-ins there), not in each view. By then the session no
longer says who was logged in, so GuestLoginMiddleware notes it before the view runs. Only
that session's own user can be adopted: the id comes from the server's session, never from
what the browser sends.
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth import SESSION_KEY
from django.contrib.auth.models import User
from django.contrib.auth.signals import user_logged_in
from django.db import DatabaseError
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.utils.deprecation import MiddlewareMixin

from accounts.services import guest_adopt

logger = logging.getLogger(__name__)

# The request's attribute holding the id of the session's user before the view ran.
USER_BEFORE = "chat_user_id_before_login"


class GuestLoginMiddleware(MiddlewareMixin):
    """Notes the id of this session's user before the view, for guest_adopted (after
    AuthenticationMiddleware). Reads no more than the session, which
    TwoFactorMiddleware, before it, has loaded already for the same request."""

    def process_view(self, request: HttpRequest, view: Any, args: Any, kwargs: Any) -> HttpResponse | None:
        user_id = request.session.get(SESSION_KEY)
        setattr(request, USER_BEFORE, User._meta.pk.to_python(user_id) if user_id is not None else None)
        return None


@receiver(user_logged_in, dispatch_uid="accounts.guest_adopted")
def guest_adopted(sender: Any, request: HttpRequest | None, user: User, **kwargs: Any) -> None:
    """The session's guest, if it had one, hands its conversations to the user now logged in."""
    guest_id = getattr(request, USER_BEFORE, None)
    if guest_id is None or guest_id == user.pk:
        return
    try:
        guest_adopt(guest_id=guest_id, user=user, request=request)
    except DatabaseError:
        # The log-in stands: the chat stays with the guest (whom the purge removes in time).
        logger.exception("guests: the conversations of guest %s did not move to %s", guest_id, user.pk)
