"""A provider that this process plays: its keys sign the ID tokens the tests want, good or bad."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from django.test import Client
from django.urls import reverse

from sso import discovery
from sso.backends import OidcBackend

ISSUER = "https://sso.example.com/realms/staff"
# The backend's own code exchange, before the fixture below plays the provider's side of it.
REAL_GET_TOKEN = OidcBackend.get_token
CLIENT_ID = "chatsite"


def new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def public_jwk(key: rsa.RSAPrivateKey, kid: str) -> dict[str, Any]:
    jwk = jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
    return {**jwk, "kid": kid, "use": "sig", "alg": "RS256"}


@dataclass
class FakeProvider:
    key: rsa.RSAPrivateKey
    kid: str = "key-1"
    # What the token endpoint answers next; the code exchanges it received.
    token_response: dict[str, Any] | None = None
    exchanges: list[dict[str, Any]] = field(default_factory=list)

    def id_token(self, *, key: rsa.RSAPrivateKey | None = None, headers: dict[str, Any] | None = None, **claims):
        now = int(time.time())
        payload = {"iss": ISSUER, "aud": CLIENT_ID, "sub": "sub-ada", "iat": now, "exp": now + 300, **claims}
        payload = {name: value for name, value in payload.items() if value is not None}
        return jwt.encode(payload, key or self.key, algorithm="RS256", headers={"kid": self.kid, **(headers or {})})

    def start(self, client: Client) -> dict[str, str]:
        """Begin a log-in in this client's session: the authorization request's parameters."""
        response = client.get(reverse("sso:start"))
        assert response.status_code == 302
        return {name: values[0] for name, values in parse_qs(urlsplit(response["Location"]).query).items()}

    def log_in(self, client: Client, *, token: str | None = None, nonce: str | None = None, **claims):
        """The whole flow: start, then the provider's redirect back with an ID token for these claims."""
        request = self.start(client)
        self.token_response = {
            "access_token": "access",
            "id_token": token or self.id_token(nonce=nonce or request["nonce"], **claims),
        }
        return client.get(reverse("sso:callback"), {"code": "code-1", "state": request["state"]})


@pytest.fixture(scope="session")
def signing_key() -> rsa.RSAPrivateKey:
    return new_key()


@pytest.fixture
def provider(settings, monkeypatch, signing_key) -> FakeProvider:
    settings.CHAT_OIDC_ISSUER = ISSUER
    settings.CHAT_OIDC_CLIENT_ID = CLIENT_ID
    settings.CHAT_OIDC_CLIENT_SECRET = "s3cret"
    settings.CHAT_OIDC_NAME = "Example SSO"
    fake = FakeProvider(key=signing_key)
    endpoints = discovery.Provider(
        issuer=ISSUER,
        authorization_endpoint=f"{ISSUER}/protocol/openid-connect/auth",
        token_endpoint=f"{ISSUER}/protocol/openid-connect/token",
        jwks_uri=f"{ISSUER}/protocol/openid-connect/certs",
    )
    monkeypatch.setattr(discovery, "provider", lambda: endpoints)
    monkeypatch.setattr(discovery, "signing_keys", lambda refresh=False: [public_jwk(fake.key, fake.kid)])

    def get_token(backend, payload):
        fake.exchanges.append(payload)
        assert fake.token_response is not None, "no log-in under way"
        return fake.token_response

    monkeypatch.setattr(OidcBackend, "get_token", get_token)
    return fake


def sub() -> str:
    return f"sub-{uuid.uuid4().hex[:8]}"
