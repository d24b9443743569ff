"""The admin site, asking staff with an authenticator for a code as the site's log-in does."""

from __future__ import annotations

from typing import Any, cast

from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import REDIRECT_FIELD_NAME
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from twofactor.login import PasswordThenCodeLoginView
from twofactor.services import session_verified, two_factor_owed


class TwoFactorAdminSite(admin.AdminSite):
    """Django's admin site (django.contrib.admin's `site`), whose log-in takes the code too.

    A staff user without an authenticator, whom nothing requires to have one, still logs in
    with the password alone: the way back in when every other admin has lost theirs
    (docs/operations.md: Two-factor).
    """

    def has_permission(self, request: HttpRequest) -> bool:
        if not super().has_permission(request):
            return False
        return session_verified(request) or not two_factor_owed(request.user)  # type: ignore[arg-type]

    def login(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # Django's AdminSite.login, with the log-in view that asks for the code.
        if request.method == "GET" and self.has_permission(request):
            return HttpResponseRedirect(reverse("admin:index", current_app=self.name))
        context: dict[str, Any] = {
            **self.each_context(request),
            "title": "Log in",
            "subtitle": None,
            "app_path": request.get_full_path(),
            "username": request.user.get_username(),
        }
        if REDIRECT_FIELD_NAME not in request.GET and REDIRECT_FIELD_NAME not in request.POST:
            context[REDIRECT_FIELD_NAME] = reverse("admin:index", current_app=self.name)
        context.update(extra_context or {})
        request.current_app = self.name
        view = PasswordThenCodeLoginView.as_view(
            extra_context=context,
            authentication_form=self.login_form or AdminAuthenticationForm,
            template_name=self.login_template or "admin/login.html",
        )
        return cast(HttpResponse, view(request))
