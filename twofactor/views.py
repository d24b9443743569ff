"""The two-factor pages: the code after the password, setting up, recovery codes, turning off."""

from __future__ import annotations

from axes.handlers.proxy import AxesProxyHandler
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import REDIRECT_FIELD_NAME, login
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.contrib.auth.signals import user_login_failed
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render, resolve_url
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_otp import login as otp_login
from django_otp.plugins.otp_static.models import StaticDevice
from django_otp.plugins.otp_totp.models import TOTPDevice

from accounts.decorators import members_only
from accounts.views import AuthenticatedHttpRequest, locked_out
from twofactor.forms import AuthenticatorCodeForm, CodeForm
from twofactor.pending import PendingLogin, pending_clear, pending_get
from twofactor.services import (
    CodeRefused,
    TwoFactorRequired,
    authenticator_qr_svg,
    authenticator_secret,
    authenticator_setup_device,
    code_check,
    recovery_codes_left,
    recovery_codes_regenerate,
    session_verified,
    two_factor_disable,
    two_factor_enable,
    two_factor_enabled,
    two_factor_required,
)


@never_cache
@require_http_methods(["GET", "POST"])
def verify(request: HttpRequest) -> HttpResponse:
    """The code that finishes a log-in: after the password, or for a session logged in without one."""
    pending = pending_get(request)
    user = pending.user if pending else _unverified_with_authenticator(request)
    if user is None:  # no log-in waiting (or it expired): start with the password
        return redirect(settings.LOGIN_URL)
    credentials = {"username": user.get_username()}
    if AxesProxyHandler.is_locked(request, credentials):
        pending_clear(request)  # back to the password, which is locked too
        return locked_out(request, credentials=credentials)
    form = CodeForm(request.POST or None)
    if request.method == "GET":
        return _verify_page(request, form)
    if not form.is_valid():
        return _verify_page(request, form, status=400)
    try:
        device = code_check(user=user, code=form.cleaned_data["code"])
    except CodeRefused as refusal:
        if not refusal.throttled:
            # A failed log-in like a wrong password: django-axes counts it towards the lock-out
            # of this username from this address, and the audit trail records it.
            user_login_failed.send(sender=__name__, credentials=credentials, request=request)
        form.add_error("code", refusal.message)
        return _verify_page(request, form, refusal=refusal)
    return _logged_in(request, user, device, pending)


def _unverified_with_authenticator(request: HttpRequest) -> User | None:
    user = request.user
    if isinstance(user, User) and not session_verified(request) and two_factor_enabled(user):
        return user
    return None


def _verify_page(
    request: HttpRequest, form: CodeForm, *, status: int = 200, refusal: CodeRefused | None = None
) -> HttpResponse:
    if refusal is not None:
        status = 429 if refusal.throttled else 400
    response = render(request, "twofactor/verify.html", {"form": form}, status=status)
    if refusal is not None and refusal.retry_after is not None:
        response["Retry-After"] = str(refusal.retry_after)
    return response


def _logged_in(
    request: HttpRequest, user: User, device: TOTPDevice | StaticDevice, pending: PendingLogin | None
) -> HttpResponse:
    if pending is not None:
        login(request, user, backend=pending.backend)
        pending_clear(request)
    otp_login(request, device)
    return redirect(_next_url(request, pending.next_url if pending else request.GET.get(REDIRECT_FIELD_NAME)))


def _next_url(request: HttpRequest, url: str | None) -> str:
    safe = url_has_allowed_host_and_scheme(url, allowed_hosts={request.get_host()}, require_https=request.is_secure())
    return url if url and safe else resolve_url(settings.LOGIN_REDIRECT_URL)


@never_cache
@login_required
@members_only
@require_http_methods(["GET", "POST"])
def setup(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Set up an authenticator: its secret and QR code, then a code from it to confirm."""
    user = request.user
    if two_factor_enabled(user):
        return redirect("twofactor:overview")
    device = authenticator_setup_device(user=user)
    form = AuthenticatorCodeForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            codes = two_factor_enable(user=user, device=device, code=form.cleaned_data["code"], request=request)
        except CodeRefused as refusal:
            form.add_error("code", refusal.message)
        else:
            otp_login(request, device)  # this session has just shown a code
            return _codes_page(request, codes, first=True)
    context = {
        "form": form,
        "secret": authenticator_secret(device),
        "qr_svg": authenticator_qr_svg(device),
        "required": two_factor_required(user),
    }
    return render(request, "twofactor/setup.html", context, status=400 if request.method == "POST" else 200)


@never_cache
@login_required
@members_only
@require_GET
def overview(request: AuthenticatedHttpRequest) -> HttpResponse:
    return _overview_page(request, CodeForm())


@never_cache
@login_required
@members_only
@require_POST
def recovery_codes(request: AuthenticatedHttpRequest) -> HttpResponse:
    """New recovery codes, shown this once; the old ones stop working."""
    if not two_factor_enabled(request.user):
        return redirect("twofactor:overview")
    return _codes_page(request, recovery_codes_regenerate(user=request.user, request=request))


@login_required
@members_only
@require_POST
def disable(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Turn two-factor log-in off, with a current code (a recovery code will do)."""
    form = CodeForm(request.POST)
    if not form.is_valid():
        return _overview_page(request, form, status=400)
    try:
        two_factor_disable(user=request.user, code=form.cleaned_data["code"], request=request)
    except TwoFactorRequired:
        form.add_error(None, "Your account requires two-factor log-in: it can't be turned off.")
        return _overview_page(request, form, status=403)
    except CodeRefused as refusal:
        form.add_error("code", refusal.message)
        return _overview_page(request, form, status=429 if refusal.throttled else 400)
    messages.success(request, "Two-factor log-in is off: your password alone logs you in now.")
    return redirect("twofactor:overview")


def _overview_page(request: AuthenticatedHttpRequest, form: CodeForm, *, status: int = 200) -> HttpResponse:
    user = request.user
    context = {
        "form": form,
        "enabled": two_factor_enabled(user),
        "required": two_factor_required(user),
        "codes_left": recovery_codes_left(user),
    }
    return render(request, "twofactor/overview.html", context, status=status)


def _codes_page(request: AuthenticatedHttpRequest, codes: list[str], *, first: bool = False) -> HttpResponse:
    context = {"codes": codes, "first": first, "next_url": _next_url(request, request.GET.get(REDIRECT_FIELD_NAME))}
    return render(request, "twofactor/recovery_codes.html", context)
