"""ASGI routes of the generation app: streams served by Channels consumers."""

from __future__ import annotations

from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from generation.consumers import ChatSocketConsumer, ChatStreamConsumer

CHAT_STREAM_PREFIX = "chat/streams/"


def chat_stream_path(stream_id: str) -> str:
    return f"/{CHAT_STREAM_PREFIX}{stream_id}/"


http_urlpatterns = [
    path(f"{CHAT_STREAM_PREFIX}<str:stream_id>/", AuthMiddlewareStack(ChatStreamConsumer.as_asgi())),
]

websocket_urlpatterns = [
    path("ws/chat/<uuid:conversation_id>/", ChatSocketConsumer.as_asgi()),
]

websocket_application = AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
