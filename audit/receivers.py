"""Log-ins, failed log-ins and lock-outs: Django's and django-axes' events, recorded."""

from __future__ import annotations

from typing import Any

from axes.signals import user_locked_out
from django.contrib.auth.models import User
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.dispatch import receiver
from django.http import HttpRequest

from audit.models import AuditRecord
from audit.services import audit_record, target_of


@receiver(user_logged_in, dispatch_uid="audit.login")
def _logged_in(sender: Any, request: HttpRequest | None, user: User, **kwargs: Any) -> None:
    audit_record(
        action=AuditRecord.Action.LOGIN, actor=user, target=target_of(user, user.get_username()), request=request
    )


@receiver(user_login_failed, dispatch_uid="audit.login_failed")
def _login_failed(sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any) -> None:
    # Django has already masked the password in `credentials`; only the name is kept.
    username = str(credentials.get("username", ""))
    audit_record(action=AuditRecord.Action.LOGIN_FAILED, target=f"username:{username}", request=request)


@receiver(user_locked_out, dispatch_uid="audit.locked_out")
def _locked_out(sender: Any, request: HttpRequest, username: str | None = None, **kwargs: Any) -> None:
    # django-axes sends this at the failure that reaches the limit, and again at each
    # attempt while locked. Only the first counts its failures (axes_failures_since_start):
    # the later attempts are recorded as the failed log-ins they are.
    if getattr(request, "axes_failures_since_start", None) is None:
        return
    audit_record(action=AuditRecord.Action.LOCKED_OUT, target=f"username:{username or ''}", request=request)
