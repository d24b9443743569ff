"""ASGI entry point: Django for HTTP (the event streams included), Channels for the WebSocket."""

from __future__ import annotations

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
# Set up Django before anything imports models.
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402

from chatsite.handlers import ProgramsHandler  # noqa: E402
from generation import routing  # noqa: E402
from generation.backends import backend  # noqa: E402

programs_asgi_app = ProgramsHandler()
PROGRAM_PATHS = ("/v1/", "/healthz", "/readyz", "/metrics")


async def http_application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    path = scope["path"].removeprefix(scope.get("root_path", ""))
    handler = programs_asgi_app if path.startswith(PROGRAM_PATHS) else django_asgi_app
    await handler(scope, receive, send)


application = ProtocolTypeRouter({"http": http_application, "websocket": routing.websocket_application})

# Load the model now, so /readyz turns 200 without waiting for a request, and settle
# the answers that a previous, dead process left streaming.
backend().start()
