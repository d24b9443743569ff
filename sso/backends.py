"""mozilla-django-oidc's authorization-code flow, with the provider's endpoints from its
discovery document, every ID token check (sso.tokens) and the users of sso.services."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import User
from django.http import HttpRequest
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from sso import discovery
from sso.refusals import ProviderUnavailable, Refusal, TokenRefused
from sso.services import sso_login_user
from sso.tokens import id_token_claims, signing_key


class OidcBackend(OIDCAuthenticationBackend):
    OIDC_RP_SIGN_ALGO = "RS256"
    OIDC_RP_IDP_SIGN_KEY = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Django builds each backend for every authenticate(), password log-ins included:
        # the parent would ask the provider for its endpoints there; here they are read when used.
        self.UserModel = get_user_model()

    @property
    def OIDC_OP_TOKEN_ENDPOINT(self) -> str:
        return discovery.provider().token_endpoint

    @property
    def OIDC_OP_USER_ENDPOINT(self) -> str | None:
        return discovery.provider().userinfo_endpoint

    @property
    def OIDC_RP_CLIENT_ID(self) -> str:
        return str(settings.CHAT_OIDC_CLIENT_ID)

    @property
    def OIDC_RP_CLIENT_SECRET(self) -> str:
        return str(settings.CHAT_OIDC_CLIENT_SECRET)

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> User | None:
        # Only sso.views' callback passes a nonce: any other log-in (a password) is not ours.
        if request is None or "nonce" not in kwargs or not settings.CHAT_OIDC_ISSUER:
            return None
        if not kwargs["nonce"]:
            raise TokenRefused("nonce", "none was sent")
        user: User | None = super().authenticate(request, **kwargs)
        return user

    def get_token(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            token: dict[str, Any] = super().get_token(payload)
        except requests.HTTPError as error:
            if error.response is not None and 400 <= error.response.status_code < 500:
                raise Refusal(
                    "code_refused",
                    "The identity provider refused this log-in's code (used already or expired).",
                    status=HTTPStatus.BAD_REQUEST,
                ) from None
            raise ProviderUnavailable(f"its token endpoint answered {error}") from None
        except requests.RequestException as error:
            raise ProviderUnavailable(f"its token endpoint: {error}") from None
        except ValueError:
            raise ProviderUnavailable("its token endpoint answered no JSON") from None
        return token

    def verify_token(self, token: Any, **kwargs: Any) -> dict[str, Any]:
        """The ID token's claims, every check passed (sso.tokens); `nonce` only for signed user info may be None."""
        if not isinstance(token, str) or not token:
            raise TokenRefused("malformed", "the provider sent no ID token")
        try:
            key = signing_key(token, discovery.signing_keys())
        except TokenRefused as refusal:
            if refusal.code != "unknown_key":
                raise
            key = signing_key(token, discovery.signing_keys(refresh=True))  # the provider rotated its keys
        return id_token_claims(
            token,
            key=key,
            issuer=discovery.provider().issuer,
            audience=str(settings.CHAT_OIDC_CLIENT_ID),
            nonce=kwargs.get("nonce"),
        )

    def get_userinfo(self, access_token: str, id_token: str, payload: dict[str, Any]) -> dict[str, Any]:
        if self.OIDC_OP_USER_ENDPOINT is None:
            return {}
        try:
            info: dict[str, Any] = super().get_userinfo(access_token, id_token, payload)
        except (requests.RequestException, ValueError) as error:
            raise ProviderUnavailable(f"its user info endpoint: {error}") from None
        if info.get("sub") != payload.get("sub"):
            raise TokenRefused("subject")  # OpenID Connect Core 5.3.2
        return info

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> User:
        info = self.get_userinfo(access_token, id_token, payload)
        # The signed ID token wins where both say something; user info adds what it lacks (groups, often).
        claims = {**info, **payload}
        return sso_login_user(issuer=discovery.provider().issuer, claims=claims, request=self.request)

    def get_user(self, user_id: int) -> User | None:
        # Django's, which refuses a deactivated user: their session ends at their next request.
        user: User | None = ModelBackend.get_user(self, user_id)
        return user
