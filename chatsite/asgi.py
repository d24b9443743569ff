"""ASGI entry point: Channels consumers for streams, Django for everything else."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
# Set up Django before anything imports models.
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import re_path  # noqa: E402

from generation import routing, runtime  # noqa: E402

application = ProtocolTypeRouter(
    {
        # URLRouter routes to ASGI apps; django-stubs types re_path for views only.
        "http": URLRouter([*routing.http_urlpatterns, re_path(r"", django_asgi_app)]),  # type: ignore[arg-type]
        "websocket": routing.websocket_application,
    }
)

# Load the model now, so /readyz turns 200 without waiting for a request, and settle
# the answers that a previous, dead process left streaming.
runtime.start()
