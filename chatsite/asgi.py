"""ASGI entry point: Django for HTTP (the event streams included), Channels for the WebSocket."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
# Set up Django before anything imports models.
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from api.errors import API_PREFIX, API_ROOT_PATHS  # noqa: E402
from chatsite import daphne_limits  # noqa: E402
from chatsite.body_limit import BodyLimit, install_in_daphne  # noqa: E402
from chatsite.handlers import ProgramsHandler  # noqa: E402
from chatsite.observability import RequestLog  # noqa: E402
from generation import routing  # noqa: E402
from generation.backends.router import backend  # noqa: E402
from generation.checks import settings_check_or_stop  # noqa: E402

settings_check_or_stop()  # no management command ran before daphne: a bad model setting stops it here

logger = logging.getLogger(__name__)

programs_asgi_app = ProgramsHandler()
PROGRAM_PATHS = (API_PREFIX, *API_ROOT_PATHS, "/healthz", "/readyz", "/metrics")


async def http_application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    path = scope["path"].removeprefix(scope.get("root_path", ""))
    handler = programs_asgi_app if path.startswith(PROGRAM_PATHS) else django_asgi_app
    await handler(scope, receive, send)


# Bodies over DATA_UPLOAD_MAX_MEMORY_SIZE are refused before they are read: here for any
# ASGI server, and in daphne's HTTP layer, which otherwise reads a whole body first.
install_in_daphne()
# A deadline for request headers, and WebSockets that stop reading while they cannot keep up.
daphne_limits.install_in_daphne()
application = ProtocolTypeRouter(
    {"http": RequestLog(BodyLimit(http_application)), "websocket": routing.websocket_application}
)

# Load the model now, so /readyz turns 200 without waiting for a request, and settle
# the answers that a previous, dead process left streaming.
backend().start()


def daphnes_reactor() -> Any | None:
    """The Twisted reactor daphne runs this process on; None when not under daphne (tests,
    other servers). Typed Any: Twisted types it as an interface, without self."""
    if "twisted.internet.reactor" not in sys.modules:
        return None
    from twisted.internet import reactor

    return reactor


def stop_gracefully_under_daphne(reactor: Any) -> None:
    """SIGTERM drains the process: no new generations (503 and Retry-After, /readyz 503),
    those under way finish for up to GRACEFUL_TIMEOUT seconds while their readers stay
    connected, the rest end as interrupted with their text; then daphne stops, and the
    process exits 0. Any other stop (Ctrl-C) interrupts what runs at once: either way the
    model's threads end before the interpreter does, which otherwise aborts it."""
    from twisted.internet import threads

    def drain_then_stop() -> None:
        backend().shut_down(settings.GRACEFUL_TIMEOUT)
        reactor.callFromThread(reactor.stop)

    def on_sigterm(signum: int, frame: object) -> None:
        logger.info("SIGTERM: finishing the generations under way (up to %g s)", settings.GRACEFUL_TIMEOUT)
        threading.Thread(target=drain_then_stop, name="chatsite-drain").start()

    # Twisted installs its own handlers as the reactor starts; this one replaces its SIGTERM's.
    reactor.callWhenRunning(signal.signal, signal.SIGTERM, on_sigterm)
    reactor.addSystemEventTrigger("before", "shutdown", threads.deferToThread, backend().shut_down, 0)


def stream_upstreams_on_daphnes_loop(reactor: Any) -> None:
    """Model servers' answers stream on daphne's own loop, where their readers wait, not on
    a thread of their own (UpstreamBackend.serve_on_running_loop says when and why)."""
    # On the loop once it runs: the asyncio reactor's calls run on asyncio's loop.
    reactor.callLater(0, backend().serve_on_running_loop)


if (daphne := daphnes_reactor()) is not None:
    stop_gracefully_under_daphne(daphne)
    stream_upstreams_on_daphnes_loop(daphne)
