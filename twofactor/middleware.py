"""Sends a logged-in user who owes a second factor to the page that takes it.

A session logged in without a code (a single sign-on, an admin's `force_login`) whose user
has an authenticator is asked for a code; a user whom the plan or CHAT_2FA_STAFF requires to
have two-factor, and who has none yet, is sent to set it up. Until then they reach only the
pages that take the code or set it up, and Log out. The API (keys are a factor of their own) is not concerned.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib.auth import REDIRECT_FIELD_NAME
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.deprecation import MiddlewareMixin
from django_htmx.http import HttpResponseClientRedirect

from twofactor.services import session_verified, two_factor_enabled, two_factor_required

# The pages that take the code or set it up, Log out, and what answers no person's session.
EXEMPT_NAMESPACES = frozenset({"api"})
EXEMPT_VIEWS = frozenset(
    {
        "twofactor:verify",
        "twofactor:setup",
        "accounts:logout",
        "admin:logout",
        "healthz",
        "readyz",
        "metrics",
        "tokenize",
        "detokenize",
    }
)


class TwoFactorMiddleware(MiddlewareMixin):
    def process_view(self, request: HttpRequest, view: Any, args: Any, kwargs: Any) -> HttpResponse | None:
        user = request.user
        if not user.is_authenticated or session_verified(request) or _exempt(request):
            return None
        if two_factor_enabled(user):
            return _sent_to(request, "twofactor:verify")
        if two_factor_required(user):
            return _sent_to(request, "twofactor:setup")
        return None


def _exempt(request: HttpRequest) -> bool:
    match = request.resolver_match
    return match is None or match.namespace in EXEMPT_NAMESPACES or match.view_name in EXEMPT_VIEWS


def _sent_to(request: HttpRequest, name: str) -> HttpResponse:
    url = reverse(name)
    if getattr(request, "htmx", False):
        return HttpResponseClientRedirect(url)
    if request.method == "GET":  # back where they were going, afterwards
        url += "?" + urlencode({REDIRECT_FIELD_NAME: request.get_full_path()})
    return HttpResponseRedirect(url)
