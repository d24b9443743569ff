"""The probes: `/healthz` (the process is up), `/readyz` (it can serve) and `/metrics`
(Prometheus's, for operators). About the process, not the chat: served by the programs'
handler (chatsite/handlers.py), without the browser's middleware.
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import Any

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from generation.backends.router import ModelRouter, backend
from infrastructure.metrics import export_loads

# The body is the same every time; async, so that answering costs no thread hop.
HEALTHY = b'{"status": "ok"}'

# A check's words for ready. A model freed while idle (CHAT_MODEL_IDLE_UNLOAD_S) serves:
# the next request loads it again.
READY = ("ok", "unloaded")


@require_GET
async def healthz(request: HttpRequest) -> HttpResponse:
    """The process is up."""
    return HttpResponse(HEALTHY, content_type="application/json")


@require_GET
@never_cache
def readyz(request: HttpRequest) -> HttpResponse:
    """Ready to serve: model loaded, database (and Redis when configured) reachable."""
    checks: dict[str, str] = {}
    generations = backend()
    checks["model"] = _model_check(generations)
    checks["database"] = _check(_connect_database)
    if settings.REDIS_URL:
        checks["redis"] = _check(_ping_redis)
    ready = all(value in READY for value in checks.values())
    body: dict[str, Any] = {"status": "ok" if ready else "unavailable"}
    if _operator(request):  # the details name hosts and errors: not for anyone
        body["checks"] = checks
    return JsonResponse(body, status=200 if ready else 503)


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus metrics, for operators only (_operator)."""
    if not _operator(request):
        return HttpResponse(
            "Metrics are for operators: send METRICS_TOKEN as a bearer token, or ask from this host.\n",
            status=403,
            content_type="text/plain",
        )
    export_loads(
        lambda: backend().loads(),
        lambda: backend().endpoint_snapshots(),
        lambda: backend().deployment_queues(),
    )
    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)


def _operator(request: HttpRequest) -> bool:
    """A caller with the bearer METRICS_TOKEN, or one on this host that no proxy relays
    (no proxy header, the one CHAT_CLIENT_IP_HEADER names included)."""
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if settings.METRICS_TOKEN and scheme.lower() == "bearer":
        return hmac.compare_digest(given.strip().encode(), settings.METRICS_TOKEN.encode())
    # A proxy on this host relays others: any header a proxy writes makes the caller remote,
    # and the configured client-address header names the caller (accounts.client_address).
    proxy_headers = ["HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", settings.CHAT_CLIENT_IP_HEADER]
    if any(name and name in request.META for name in proxy_headers):
        return False
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR", "")).is_loopback
    except ValueError:
        return False


def _model_check(generations: ModelRouter) -> str:
    """ "ok", "unloaded" (freed while idle), or why the default model can't serve."""
    if not generations.ready():
        return generations.not_ready_reason()
    loads = generations.loads()
    freed = any(load.model == settings.CHAT_MODEL and load.loaded is False for load in loads)
    return "unloaded" if freed else "ok"


def _connect_database() -> None:
    """A new connection, closed at once: the probe runs on a thread of its own request,
    whose connection nothing else closes (chatsite.handlers.ProgramsHandler)."""
    try:
        connection.ensure_connection()
    finally:
        connection.close()


def _check(probe: Any) -> str:
    try:
        probe()
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return "ok"


def _ping_redis() -> None:
    assert settings.REDIS_URL
    redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1).ping()
