"""The provider's endpoints and keys, from its discovery document: fetched once, lazily, and
kept for the life of the process (the signing keys again when a token names a new one)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import requests
from django.conf import settings

from sso.refusals import ProviderUnavailable

DISCOVERY_PATH = "/.well-known/openid-configuration"


@dataclass(frozen=True)
class Provider:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    userinfo_endpoint: str | None = None


_lock = threading.Lock()
_providers: dict[str, Provider] = {}
_keys: dict[str, list[dict[str, Any]]] = {}


def provider() -> Provider:
    """The configured provider's endpoints; ProviderUnavailable when it cannot say them."""
    issuer = settings.CHAT_OIDC_ISSUER
    with _lock:
        found = _providers.get(issuer)
    if found is None:
        found = _discover(issuer)
        with _lock:
            _providers[issuer] = found
    return found


def signing_keys(*, refresh: bool = False) -> list[dict[str, Any]]:
    """The provider's public keys (JWKs), fetched again when `refresh` (a key rotated)."""
    jwks_uri = provider().jwks_uri
    with _lock:
        keys = None if refresh else _keys.get(jwks_uri)
    if keys is None:
        document = _json(jwks_uri)
        keys = document.get("keys")
        if not isinstance(keys, list) or not all(isinstance(key, dict) for key in keys):
            raise ProviderUnavailable(f"{jwks_uri} holds no list of keys")
        with _lock:
            _keys[jwks_uri] = keys
    return keys


def forget() -> None:
    """Fetch everything afresh next time (tests, a provider moved)."""
    with _lock:
        _providers.clear()
        _keys.clear()


def _discover(issuer: str) -> Provider:
    url = issuer + DISCOVERY_PATH
    document = _json(url)
    fields = {}
    for name in ("issuer", "authorization_endpoint", "token_endpoint", "jwks_uri", "userinfo_endpoint"):
        value = document.get(name)
        if value is None and name == "userinfo_endpoint":
            continue
        if not isinstance(value, str) or not _is_url(value):
            raise ProviderUnavailable(f"{url} has no valid {name}")
        fields[name] = value
    if fields["issuer"].rstrip("/") != issuer:
        # OpenID Connect Discovery 4.3: the document must name the issuer it was asked for.
        raise ProviderUnavailable(f"{url} names the issuer {fields['issuer']!r}, not {issuer!r} (CHAT_OIDC_ISSUER)")
    return Provider(**fields)


def _json(url: str) -> dict[str, Any]:
    try:
        response = requests.get(url, timeout=settings.OIDC_TIMEOUT, headers={"Accept": "application/json"})
        response.raise_for_status()
        document = response.json()
    except (requests.RequestException, ValueError) as error:
        raise ProviderUnavailable(f"{url}: {error}") from None
    if not isinstance(document, dict):
        raise ProviderUnavailable(f"{url} is not a JSON object")
    return document


def _is_url(text: str) -> bool:
    parts = urlsplit(text)
    return parts.scheme in ("http", "https") and bool(parts.netloc)
