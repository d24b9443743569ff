from __future__ import annotations

import datetime as dt
import math
from typing import Any

from axes.helpers import get_client_username
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login, logout, update_session_auth_hash
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import UserCreationForm
from django.contrib.auth.models import User
from django.db.models import Max
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse_lazy
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from accounts.client_address import client_ip
from accounts.decorators import guests_enabled, members_only
from accounts.forms import ApiKeyCreateForm, EmailForm, KeyBudgetForm, KeySettingsForm, LoginForm, SignupForm
from accounts.model_access import usable_models
from accounts.models import KEY_LIMIT_FIELDS, ApiKey
from accounts.services import (
    QuotaExceeded,
    account_for,
    api_key_create,
    api_key_revoke,
    api_key_settings_change,
    guest_convert,
    guest_create,
    password_reset_admit,
    quota_for,
    signup_admit,
    signup_open,
    user_is_guest,
)
from audit.models import AuditRecord
from audit.services import audit_record, target_of
from twofactor.login import PasswordThenCodeLoginView

# A guest's session lasts as long as the guest may stay idle before the purge removes it.
DAY_S = 24 * 60 * 60


class AuthenticatedHttpRequest(HttpRequest):
    """A request to a login_required view."""

    user: User


@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    """Sign-up as CHAT_SIGNUP says: open, waiting for an admin's approval, or closed (403)."""
    if request.user.is_authenticated:
        return redirect("generation:chat")
    if not signup_open():
        return render(request, "accounts/signup_closed.html", status=403)
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            signup_admit(address=client_ip(request))
        except QuotaExceeded as refusal:
            response = render(request, "accounts/signup.html", {"form": form, "refusal": refusal.message}, status=429)
            response["Retry-After"] = str(refusal.retry_after)
            return response
        user = form.save(commit=False)
        user.is_active = settings.CHAT_SIGNUP == "open"
        user.save()
        _signup_recorded(request, user)
        if not user.is_active:
            return redirect("accounts:signup_pending")
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        return redirect("generation:chat")
    status = 400 if request.method == "POST" else 200
    context = {"form": form, "approval": settings.CHAT_SIGNUP == "approval"}
    return render(request, "accounts/signup.html", context, status=status)


def _signup_recorded(request: HttpRequest, user: User) -> None:
    audit_record(action=AuditRecord.Action.SIGNUP, actor=user, target=target_of(user, user.username), request=request)


@require_GET
def signup_pending(request: HttpRequest) -> HttpResponse:
    return render(request, "accounts/signup_pending.html")


class PasswordChangeRecorded:
    """A view whose valid form sets `form.user`'s password: the change goes in the audit trail."""

    request: HttpRequest

    def form_valid(self, form: Any) -> HttpResponse:
        response = super().form_valid(form)  # type: ignore[misc]
        user = form.user
        target = target_of(user, user.get_username())
        audit_record(action=AuditRecord.Action.PASSWORD_CHANGED, actor=user, target=target, request=self.request)
        return response


class PasswordChangeView(PasswordChangeRecorded, auth_views.PasswordChangeView):
    """Django's password change, recorded in the audit trail."""

    template_name = "accounts/password_change.html"
    success_url = reverse_lazy("accounts:password_change_done")


class PasswordResetConfirmView(PasswordChangeRecorded, auth_views.PasswordResetConfirmView):
    """Django's new password from a reset link, recorded in the audit trail."""

    template_name = "accounts/password_reset_confirm.html"
    success_url = reverse_lazy("accounts:password_reset_complete")


class LoginView(PasswordThenCodeLoginView):
    """Django's log-in page, offering sign-up unless it is closed; a user with two-factor log-in
    is asked for a code after the password (twofactor)."""

    template_name = "accounts/login.html"
    redirect_authenticated_user = True
    form_class = LoginForm

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        # A guest logs in here to keep the chat (accounts.guests): only members are sent on.
        self.redirect_authenticated_user = not user_is_guest(request.user)
        return super().dispatch(request, *args, **kwargs)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        return {
            **context,
            "signup_open": signup_open(),
            "guests_on": settings.CHAT_GUEST,
            "password_login": settings.CHAT_PASSWORD_LOGIN,
            "sso_name": settings.CHAT_OIDC_NAME if settings.CHAT_OIDC_ISSUER else "",
        }

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not settings.CHAT_PASSWORD_LOGIN:  # single sign-on only; superusers still log in at /admin/
            response = self.get(request, *args, **kwargs)
            response.status_code = 403
            return response
        return super().post(request, *args, **kwargs)


@guests_enabled
@require_POST
def guest_start(request: HttpRequest) -> HttpResponse:
    """Try it without an account: a new guest, logged in by this session alone."""
    if request.user.is_authenticated:
        return redirect("generation:chat")
    address = client_ip(request)
    if address is None:  # its limits are counted by address: none, no guest
        return render(request, "accounts/guest_refused.html", {"no_address": True}, status=403)
    try:
        user = guest_create(address=address)
    except QuotaExceeded as refusal:
        response = render(request, "accounts/guest_refused.html", {"refusal": refusal.message}, status=429)
        response["Retry-After"] = str(refusal.retry_after)
        return response
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    request.session.set_expiry(settings.CHAT_GUEST_TTL_DAYS * DAY_S)
    return redirect("generation:chat")


@login_required
@require_http_methods(["GET", "POST"])
def guest_keep(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Keep this chat: sign up (the guest becomes an account, its conversation with it), or
    log in to an account one has (accounts.guests moves the conversation there). No sign-up
    where it makes no password accounts: CHAT_SIGNUP closed, or CHAT_PASSWORD_LOGIN=0."""
    if not user_is_guest(request.user):
        return redirect("generation:chat")
    if not signup_open():
        return _guest_keep_page(request, form=None, status=403 if request.method == "POST" else 200)
    # A copy: the form writes the name it checks onto its instance, and the page shows request.user's.
    guest = User.objects.get(pk=request.user.pk)
    form: UserCreationForm[User] = UserCreationForm(request.POST or None, instance=guest, initial={"username": ""})
    if request.method == "POST" and form.is_valid():
        active = settings.CHAT_SIGNUP == "open"
        user = form.instance
        guest_convert(user=user, username=user.username, password=form.cleaned_data["password1"], active=active)
        _signup_recorded(request, user)
        if not active:
            logout(request)
            return redirect("accounts:signup_pending")
        update_session_auth_hash(request, user)  # the new password would end this session
        request.session.set_expiry(None)  # back to the site's session age
        return redirect("generation:chat")
    return _guest_keep_page(request, form=form, status=400 if request.method == "POST" else 200)


def _guest_keep_page(request: HttpRequest, *, form: UserCreationForm[User] | None, status: int) -> HttpResponse:
    context = {
        "form": form,
        "approval": settings.CHAT_SIGNUP == "approval",
        "password_login": settings.CHAT_PASSWORD_LOGIN,
        "sso_name": settings.CHAT_OIDC_NAME if settings.CHAT_OIDC_ISSUER else "",
    }
    return render(request, "accounts/guest_keep.html", context, status=status)


def locked_out(
    request: HttpRequest, original_response: Any = None, credentials: dict[str, Any] | None = None
) -> HttpResponse:
    """django-axes' answer to a log-in while locked out (AXES_LOCKOUT_CALLABLE): for how long yet."""
    username = get_client_username(request, credentials)
    failures = AccessAttempt.objects.filter(username=username, ip_address=getattr(request, "axes_ip_address", None))
    last = failures.aggregate(last=Max("attempt_time"))["last"] or timezone.now()
    wait_s = max(1, math.ceil((last + settings.AXES_COOLOFF_TIME - timezone.now()).total_seconds()))
    context = {"username": username, "failure_limit": settings.AXES_FAILURE_LIMIT, "minutes": math.ceil(wait_s / 60)}
    response = render(request, "accounts/locked_out.html", context, status=429)
    response["Retry-After"] = str(wait_s)
    return response


# never_cache: the response to a create holds the plain key; no cache may keep it.
@never_cache
@login_required
@members_only
@require_http_methods(["GET", "POST"])
def keys(request: AuthenticatedHttpRequest) -> HttpResponse:
    """The user's API keys; a POST makes one and shows its plain key this once."""
    limits = account_for(request.user).limits
    form = ApiKeyCreateForm(request.POST or None, limits=limits)
    if request.method == "GET":
        return _keys_page(request, form)
    if not form.is_valid():
        return _keys_page(request, form, status=400)
    days = form.cleaned_data["expires_in_days"]
    _, plain_key = api_key_create(
        user=request.user,
        name=form.cleaned_data["name"],
        expires_at=timezone.now() + dt.timedelta(days=days) if days else None,
        request=request,
        **{name: form.cleaned_data[name] for name in KEY_LIMIT_FIELDS},
    )
    return _keys_page(request, ApiKeyCreateForm(limits=limits), plain_key=plain_key, status=201)


@login_required
@members_only
@require_POST
def key_revoke(request: AuthenticatedHttpRequest, key_id: int) -> HttpResponse:
    key = get_object_or_404(ApiKey, pk=key_id, user=request.user)
    api_key_revoke(key=key, request=request)
    messages.success(request, f"Revoked the key “{key.name}”. Requests with it are now refused.")
    return redirect("accounts:keys")


@login_required
@members_only
@require_http_methods(["GET", "POST"])
def key_settings(request: AuthenticatedHttpRequest, key_id: int, budget_only: bool = False) -> HttpResponse:
    """A key's settings, which its owner changes: its limits, expiry and models, each within
    the owner's (KeySettingsForm), and its budget within theirs (KeyBudgetForm); at
    /budget/, its budget alone. A change applies from the next request on, in every
    process, and is recorded in the audit trail with the before and after of what changed.

    A team's key (a service account) is its maker's to change here, as its budget is."""
    key = get_object_or_404(ApiKey, pk=key_id, user=request.user, revoked_at__isnull=True)
    account = account_for(request.user)
    data = request.POST if request.method == "POST" else None
    current = key.budgets.first()
    initial = {} if current is None else {f: getattr(current, f) for f in ("period", "unit", "amount", "currency")}
    budget_form = KeyBudgetForm(data, initial=initial, account=account)
    form = None
    if not budget_only:
        models = usable_models(request.user)
        form = KeySettingsForm(data, key=key, limits=account.limits, models=models)
    if data is not None and all([each.is_valid() for each in (form, budget_form) if each is not None]):
        fields = form.cleaned_data if form is not None else {}
        try:
            changed = api_key_settings_change(
                user=request.user, key_id=key_id, fields=fields, budget=budget_form.cleaned_data, request=request
            )
        except ApiKey.DoesNotExist:  # revoked meanwhile
            raise Http404("No such key.") from None
        if budget_only:
            done = "Saved the budget" if budget_form.cleaned_data["amount"] is not None else "Removed the budget"
            messages.success(request, f"{done} of the key “{key.name}”.")
        elif changed:
            messages.success(request, f"Saved the settings of the key “{key.name}”; they apply from its next request.")
        else:
            messages.success(request, f"Nothing to change in the key “{key.name}”.")
        return redirect("accounts:keys")
    context = {"form": form, "budget_form": budget_form, "key": key, "budget": current, "budget_only": budget_only}
    return render(request, "accounts/key_settings.html", context, status=200 if data is None else 400)


def _keys_page(
    request: AuthenticatedHttpRequest, form: ApiKeyCreateForm, *, plain_key: str | None = None, status: int = 200
) -> HttpResponse:
    account = account_for(request.user)
    context = {
        "form": form,
        "plain_key": plain_key,
        "api_keys": ApiKey.objects.filter(user=request.user).prefetch_related("budgets").order_by("-created_at", "-pk"),
        "account": account,
        "quota": quota_for(request.user, limits=account.limits),
    }
    return render(request, "accounts/keys.html", context, status=status)


class PasswordResetView(auth_views.PasswordResetView):
    """Django's password reset by e-mail, or, with no e-mail set up (EMAIL_HOST), a page
    that says an administrator resets passwords.

    The page says the same whether an account has the address or not, and at most
    PASSWORD_RESETS_PER_MINUTE are asked for from one client address in any minute.
    A mail server that fails is logged by Django, and the page says the same again.
    """

    template_name = "accounts/password_reset_form.html"
    email_template_name = "accounts/password_reset_email.txt"
    subject_template_name = "accounts/password_reset_subject.txt"
    success_url = reverse_lazy("accounts:password_reset_done")

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not settings.CHAT_EMAIL:
            return render(request, "accounts/password_reset_unavailable.html")
        return super().dispatch(request, *args, **kwargs)

    def form_valid(self, form: Any) -> HttpResponse:
        try:
            password_reset_admit(address=client_ip(self.request))
        except QuotaExceeded as refusal:
            response = self.render_to_response(self.get_context_data(form=form, refusal=refusal.message), status=429)
            response["Retry-After"] = str(refusal.retry_after)
            return response
        return super().form_valid(form)


@login_required
@members_only
@require_http_methods(["GET", "POST"])
def email(request: AuthenticatedHttpRequest) -> HttpResponse:
    """The account's e-mail address, where a password reset is sent."""
    form = EmailForm(request.POST or None, instance=request.user)
    if request.method == "POST" and form.is_valid():
        form.save()
        messages.success(request, "Saved your e-mail address.")
        return redirect("accounts:email")
    status = 400 if request.method == "POST" else 200
    return render(request, "accounts/email.html", {"form": form, "email_on": settings.CHAT_EMAIL}, status=status)
