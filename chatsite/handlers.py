"""The ASGI handler for the requests of programs: the API and the probes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, cast

from csp.middleware import CSPMiddleware
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpRequest, HttpResponseBase
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.security import SecurityMiddleware
from django.urls import set_script_prefix

from chatsite.observability import remember_route

LIVENESS_PATH = "/healthz"


class ProgramsHandler(ASGIHandler):
    """Django's ASGI handler without middleware, for the requests of programs: the API and the probes.

    Their callers send an API key or nothing: no session, CSRF token, message, login or
    redirect to handle. In an async view each of Django's MiddlewareMixin middlewares
    costs two thread hops, about 1.5 ms of every completion's first token here
    (docs/benchmarks.md, Fast at the door), so these requests skip them. Their responses
    still get the same security headers as the pages (nosniff, referrer and opener
    policies, HSTS, X-Frame-Options, Content-Security-Policy): the header-setting halves
    of those middlewares are called directly, in this thread, with no hop. HTTPS
    redirects are for browsers: an API client or a load balancer's probe follows none.
    Their database work runs on threads that keep their connections
    (infrastructure/database.py), never on a thread of the request's own (`handle`).
    """

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Django's request cycle (`ASGIHandler.handle`), with the request signals sent in
        this thread instead of a thread of the request's own.

        Django sends `request_started` and `request_finished` with `asend`, which runs their
        synchronous receivers (close_old_connections, reset_queries, close_caches) through
        `sync_to_async`: the first such call makes the request a thread of its own, and its
        end joins that thread on yet another. For a completion that was an eighth of the
        server's CPU (py-spy, bench/door.py), to run receivers that have nothing to do: the
        requests of programs touch the database only on the database threads, which keep
        and check their connections, so this thread holds none for them to close. The rest
        is Django's: the disconnect that cancels a view (a dropped stream stops its
        generation), the response's closing.
        """
        try:
            body = await self.read_body(receive)
        except RequestAborted:
            return
        with body:
            set_script_prefix(get_script_prefix(scope))
            signals.request_started.send(sender=self.__class__, scope=scope)
            request, refusal = self.create_request(scope, body)
            if request is None:
                await self.send_response(cast(HttpResponseBase, refusal), send)
                cast(HttpResponseBase, refusal).close()
            elif scope["path"] == LIVENESS_PATH:  # answered at once: nothing to cancel
                response = await self.run_get_response(request)
                await self.send_response(response, send)
                response.close()
            else:
                await self._respond_unless_disconnected(request, receive, send)

    async def _respond_unless_disconnected(self, request: HttpRequest, receive: Any, send: Any) -> None:
        """As Django's `handle`: the view runs while the connection is watched, and is
        cancelled if the client leaves first."""

        async def respond() -> HttpResponseBase:
            response = await self.run_get_response(request)
            with contextlib.suppress(asyncio.CancelledError):  # the client left while it was sent
                await self.send_response(response, send)
            return response

        listening = asyncio.create_task(self.listen_for_disconnect(receive))
        responding = asyncio.create_task(respond())
        try:
            await asyncio.wait([listening, responding], return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Also when this request is cancelled itself (daphne cancels the requests still
            # open as it stops): a task left behind would end unawaited, its disconnect
            # logged as "Task exception was never retrieved".
            for task in (listening, responding):
                if not task.done():
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError, RequestAborted):
                    await task
        if responding.cancelled():
            signals.request_finished.send(sender=self.__class__)
        else:
            responding.result().close()  # sends request_finished

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
