"""A log-in half done: the password was right, the code is yet to come.

Kept in the session, not as a logged-in user: until the code, the session is nobody's,
so no page, event stream or WebSocket serves it. It lasts PENDING_S seconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.models import User
from django.http import HttpRequest

SESSION_KEY = "twofactor_pending"
PENDING_S = 5 * 60


@dataclass(frozen=True)
class PendingLogin:
    user: User
    backend: str  # the authentication backend that took the password, for login()
    next_url: str


def pending_start(request: HttpRequest, *, user: User, next_url: str) -> None:
    backend = getattr(user, "backend", None) or settings.AUTHENTICATION_BACKENDS[-1]
    request.session[SESSION_KEY] = {
        "user_id": user.pk,
        "backend": backend,
        "next": next_url,
        "until": time.time() + PENDING_S,
    }


def pending_get(request: HttpRequest) -> PendingLogin | None:
    """The log-in waiting for a code in this session, if any and not expired."""
    state = request.session.get(SESSION_KEY)
    if not isinstance(state, dict) or state.get("until", 0) < time.time():
        return None
    if state.get("backend") not in settings.AUTHENTICATION_BACKENDS:
        return None
    user_id = state.get("user_id")
    user = User.objects.filter(pk=user_id, is_active=True).first() if isinstance(user_id, int) else None
    if user is None:
        return None
    return PendingLogin(user=user, backend=state["backend"], next_url=str(state.get("next") or ""))


def pending_clear(request: HttpRequest) -> None:
    request.session.pop(SESSION_KEY, None)
