"""ASGI entry point: Django for HTTP (the event streams included), Channels for the WebSocket."""

from __future__ import annotations

import os
from typing import Any

from django.core.asgi import get_asgi_application
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
# Set up Django before anything imports models.
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402

from chatsite.body_limit import BodyLimit, install_in_daphne  # noqa: E402
from generation import routing  # noqa: E402
from generation.backends import backend  # noqa: E402


class ProgramsHandler(ASGIHandler):
    """Django's ASGI handler without middleware, for the requests of programs: the API and the probes.

    Their callers send an API key or nothing: no session, CSRF token, message, login or
    page frame to handle. In an async view each of Django's MiddlewareMixin middlewares
    costs two thread hops, about 1.5 ms of every completion's first token here
    (docs/benchmarks.md, upstream backend), so these requests skip them. The API sets its
    own headers (api.views.api_view); HTTPS redirects are for browsers.
    """

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        self._middleware_chain = convert_exception_to_response(self._get_response_async)  # type: ignore[attr-defined]


programs_asgi_app = ProgramsHandler()
PROGRAM_PATHS = ("/v1/", "/healthz", "/readyz", "/metrics")


async def http_application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    path = scope["path"].removeprefix(scope.get("root_path", ""))
    handler = programs_asgi_app if path.startswith(PROGRAM_PATHS) else django_asgi_app
    await handler(scope, receive, send)


# Bodies over DATA_UPLOAD_MAX_MEMORY_SIZE are refused before they are read: here for any
# ASGI server, and in daphne's HTTP layer, which otherwise reads a whole body first.
install_in_daphne()
application = ProtocolTypeRouter({"http": BodyLimit(http_application), "websocket": routing.websocket_application})

# Load the model now, so /readyz turns 200 without waiting for a request, and settle
# the answers that a previous, dead process left streaming.
backend().start()
