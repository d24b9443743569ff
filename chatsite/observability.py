"""Each HTTP request's id, log line and metrics, around the whole ASGI application.

ASGI middleware rather than Django middleware: it sees every request, the API's and the
probes' (served without middleware, chatsite.asgi.ProgramsHandler) and static files
included, and it sees a streamed response end, so a stream's line and duration are its
whole length.
"""

from __future__ import annotations

import time
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest
from django.urls import Resolver404, resolve

from infrastructure import logs
from infrastructure.metrics import HTTP_DURATION, HTTP_REQUESTS

ASGIApp = Any


class RequestLog:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        given = headers.get(b"x-request-id", b"").decode("latin-1")
        fields = logs.request_begin(given)
        request_id = fields["request_id"].encode()
        fields.update(method=scope["method"], path=scope["path"], status=500)
        if query := scope.get("query_string", b"").decode("latin-1"):
            fields["query"] = logs.redacted_query(query)
        started = time.perf_counter()

        async def send_with_id(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                fields["status"] = message["status"]
                response_headers = list(message.get("headers", []))
                if not any(name.lower() == b"x-request-id" for name, _ in response_headers):
                    response_headers.append((b"X-Request-Id", request_id))
                message = {**message, "headers": response_headers}
            await send(message)

        app_scope = {**scope, logs.REQUEST_LOGGED: True}
        try:
            await self.app(app_scope, receive, send_with_id)
        finally:
            duration = time.perf_counter() - started
            fields["duration_ms"] = round(duration * 1000, 1)
            route = app_scope.get(ROUTE) or route_of(scope["path"])
            HTTP_REQUESTS.labels(route, scope["method"], str(fields["status"])).inc()
            HTTP_DURATION.labels(route).observe(duration)
            logs.log_request(fields)


# Where the handlers note the URL pattern Django matched (remember_route): resolving the
# path again for the metrics' label cost every request a second resolve.
ROUTE = "chatsite.route"


def remember_route(request: HttpRequest) -> None:
    """Note in the request's ASGI scope the URL pattern it matched, for RequestLog."""
    scope = getattr(request, "scope", None)
    if request.resolver_match is not None and scope is not None:
        scope[ROUTE] = "/" + request.resolver_match.route


def route_of(path: str) -> str:
    """The URL pattern a path matched (few values, for a metric's label), not the path itself."""
    if path.startswith(f"/{settings.STATIC_URL.lstrip('/')}"):
        return "static"
    try:
        return "/" + resolve(path).route
    except Resolver404:
        return "unmatched"


class RequestUserMiddleware:
    """Names the signed-in user in the request's log line (after AuthenticationMiddleware).

    Async-capable, and it never loads the user itself: a request whose view did not look
    at `request.user` is logged without it rather than paying a session lookup for a log.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if iscoroutinefunction(self):
            return self._acall(request)
        response = self.get_response(request)
        self._annotate(request)
        return response

    async def _acall(self, request: HttpRequest) -> Any:
        response = await self.get_response(request)
        self._annotate(request)
        return response

    @staticmethod
    def _annotate(request: HttpRequest) -> None:
        remember_route(request)
        # AuthenticationMiddleware caches the user here once something has read request.user.
        user = getattr(request, "_cached_user", None)
        if user is not None and user.is_authenticated:
            logs.annotate(user_id=user.pk)
