"""Which pages may open the chat's WebSocket: this site's own, and the trusted origins."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain


class SameOriginValidator:
    """Let a WebSocket in only when its Origin is this site's own origin or a trusted one.

    A WebSocket carries the session cookie but no CSRF token, so its Origin is checked by
    the rule Django's CSRF check applies to a form post over HTTPS: the Origin equals
    the site's scheme, host and port as the request states them (its Host header, which
    must be one of ALLOWED_HOSTS, and https when it came over TLS or, by
    SECURE_PROXY_SSL_HEADER, through a proxy that did), or it is one of
    CSRF_TRUSTED_ORIGINS. Written here because Channels' AllowedHostsOriginValidator
    compares the Origin's host name with ALLOWED_HOSTS alone: a page served on another
    port of an allowed host (say http://localhost:9999) passed it.
    """

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if socket_origin_allowed(scope):
            await self.application(scope, receive, send)
        else:
            await WebsocketDenier()(scope, receive, send)


def socket_origin_allowed(scope: dict[str, Any]) -> bool:
    headers = {name.decode("latin1").lower(): value.decode("latin1") for name, value in scope.get("headers", [])}
    origin, host = headers.get("origin", ""), headers.get("host", "")
    if not origin or not _host_allowed(host):
        return False
    return origin == f"{_scheme(scope, headers)}://{host}" or _trusted(origin)


def _host_allowed(host: str) -> bool:
    domain, _port = split_domain_port(host)
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]  # as HttpRequest.get_host() allows
    return bool(domain) and validate_host(domain, allowed)


def _scheme(scope: dict[str, Any], headers: dict[str, str]) -> str:
    """http or https, as HttpRequest.scheme decides it."""
    if settings.SECURE_PROXY_SSL_HEADER:
        meta_name, secure_value = settings.SECURE_PROXY_SSL_HEADER
        forwarded = headers.get(meta_name.removeprefix("HTTP_").lower().replace("_", "-"))
        if forwarded is not None:
            return "https" if forwarded.split(",", 1)[0].strip() == secure_value else "http"
    return "https" if scope.get("scheme") in ("wss", "https") else "http"


def _trusted(origin: str) -> bool:
    """One of CSRF_TRUSTED_ORIGINS, where `https://*.example.com` takes every subdomain."""
    if origin in settings.CSRF_TRUSTED_ORIGINS:
        return True
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    wildcards = (urlsplit(trusted) for trusted in settings.CSRF_TRUSTED_ORIGINS if "*" in trusted)
    return any(
        parts.scheme == trusted.scheme and is_same_domain(parts.netloc, trusted.netloc.lstrip("*"))
        for trusted in wildcards
    )
