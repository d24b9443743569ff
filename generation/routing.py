"""ASGI routes of the chat app that Django's URLconf can't serve: its WebSocket."""

from __future__ import annotations

from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from django.urls import path

from generation.consumers import ChatSocketConsumer
from generation.origins import SameOriginValidator

websocket_urlpatterns = [
    path("ws/chat/<uuid:conversation_id>/", ChatSocketConsumer.as_asgi()),
]

websocket_application = SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
