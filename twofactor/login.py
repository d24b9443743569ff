"""The password step of a log-in, for the site's and the admin's log-in pages."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpResponse
from django.shortcuts import redirect

from twofactor.pending import pending_start
from twofactor.services import two_factor_enabled


class PasswordThenCodeLoginView(auth_views.LoginView):
    """Django's log-in page, where a user with an authenticator is not logged in by the password
    alone: the session keeps the log-in pending, and the code page finishes it.

    A user who must have two-factor but has not set it up yet is logged in, and
    twofactor.middleware sends them to set it up before anything else.
    """

    def form_valid(self, form: AuthenticationForm) -> HttpResponse:
        user = form.get_user()
        if not two_factor_enabled(user):
            return super().form_valid(form)
        pending_start(self.request, user=user, next_url=self.get_success_url())
        return redirect("twofactor:verify")
