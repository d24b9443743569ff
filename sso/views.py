"""Log in with the OpenID Connect provider: the start (a redirect to it) and the callback."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from django.conf import settings
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views import View
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from audit.models import AuditRecord
from audit.services import audit_record
from sso import discovery
from sso.refusals import Refusal

logger = logging.getLogger(__name__)


class StartView(OIDCAuthenticationRequestView):
    """Redirects to the provider with a new state, nonce and PKCE challenge kept in the session."""

    def __init__(self, **kwargs: Any) -> None:
        View.__init__(self, **kwargs)  # not the parent's, which asks the provider for its endpoints at once

    @property
    def OIDC_OP_AUTH_ENDPOINT(self) -> str:
        return discovery.provider().authorization_endpoint

    @property
    def OIDC_RP_CLIENT_ID(self) -> str:
        return str(settings.CHAT_OIDC_CLIENT_ID)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not settings.CHAT_OIDC_ISSUER:
            raise Http404("Single sign-on is not configured.")
        try:
            discovery.provider()
        except Refusal as refusal:
            return refused(request, refusal)
        response: HttpResponse = super().get(request)
        return response


class CallbackView(OIDCAuthenticationCallbackView):
    """Where the provider sends the browser back: the code exchanged, the tokens checked, the user logged in."""

    def get(self, request: HttpRequest) -> HttpResponse:
        if not settings.CHAT_OIDC_ISSUER:
            raise Http404("Single sign-on is not configured.")
        try:
            response: HttpResponse = super().get(request)
        except Refusal as refusal:
            return refused(request, refusal)
        except SuspiciousOperation:  # a state this session did not start, or one used already
            return refused(request, _state_refusal())
        return response

    def login_failure(self) -> HttpResponse:
        error = self.request.GET.get("error")
        if error:
            refusal = Refusal("provider_error", f"The identity provider did not log you in ({error[:100]}).")
        else:
            refusal = _state_refusal()
        return refused(self.request, refusal)


def refused(request: HttpRequest, refusal: Refusal) -> HttpResponse:
    """The refusal page, recorded in the audit trail as a failed log-in."""
    logger.warning("sso: log-in refused: %s: %s", refusal.code, refusal.message)
    audit_record(action=AuditRecord.Action.LOGIN_FAILED, target=f"sso:{refusal.code}", request=request)
    context = {"message": refusal.message, "name": settings.CHAT_OIDC_NAME}
    return render(request, "sso/refused.html", context, status=refusal.status)


def _state_refusal() -> Refusal:
    return Refusal(
        "state",
        "This log-in was used already, or began in another browser. Start again.",
        status=HTTPStatus.BAD_REQUEST,
    )
