"""The ASGI handler for the requests of programs: the API and the probes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

from csp.middleware import CSPMiddleware
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpRequest, HttpResponseBase
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.security import SecurityMiddleware

from chatsite.observability import remember_route

LIVENESS_PATH = "/healthz"


class ProgramsHandler(ASGIHandler):
    """Django's ASGI handler without middleware, for the requests of programs: the API and the probes.

    Their callers send an API key or nothing: no session, CSRF token, message, login or
    redirect to handle. In an async view each of Django's MiddlewareMixin middlewares
    costs two thread hops, about 1.5 ms of every completion's first token here
    (docs/benchmarks.md, upstream backend), so these requests skip them. Their responses
    still get the same security headers as the pages (nosniff, referrer and opener
    policies, HSTS, X-Frame-Options, Content-Security-Policy): the header-setting halves
    of those middlewares are called directly, in this thread, with no hop. HTTPS
    redirects are for browsers: an API client or a load balancer's probe follows none.
    """

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == LIVENESS_PATH:
            await self._handle_liveness(scope, receive, send)
        else:
            await super().handle(scope, receive, send)

    async def _handle_liveness(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """/healthz, the probe a load balancer sends every few seconds, without the request
        signals: their receivers (close_old_connections, reset_queries) are synchronous,
        so each signal costs a thread hop, and the probe touches no database. Measured:
        bench/door.py. The response is the view's, with the same headers (the chain above)."""
        try:
            body = await self.read_body(receive)
        except RequestAborted:
            return
        with body:
            request, refusal = self.create_request(scope, body)
            response = refusal if request is None else await self.get_response_async(request)
            await self.send_response(cast(HttpResponseBase, response), send)

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        get_response = cast(
            Callable[[HttpRequest], Awaitable[HttpResponseBase]],
            convert_exception_to_response(self._response_for_allowed_host),
        )
        # Only their process_response is used: pure header logic, no I/O.
        headers = [
            middleware(get_response) for middleware in (SecurityMiddleware, XFrameOptionsMiddleware, CSPMiddleware)
        ]

        async def respond(request: HttpRequest) -> HttpResponseBase:
            response = await get_response(request)
            remember_route(request)
            for middleware in headers:
                # The stubs say HttpResponse; Django's own chain passes streaming responses too.
                response = middleware.process_response(request, response)  # type: ignore[arg-type]
            return response

        self._middleware_chain = respond

    async def _response_for_allowed_host(self, request: HttpRequest) -> HttpResponseBase:
        request.get_host()  # DisallowedHost (400) unless ALLOWED_HOSTS has it, as CommonMiddleware checks
        response: HttpResponseBase = await self._get_response_async(request)  # type: ignore[attr-defined]
        return response
