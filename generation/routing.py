"""ASGI routes of the chat app that Django's URLconf can't serve: its WebSocket."""

from __future__ import annotations

from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from generation.consumers import ChatSocketConsumer

websocket_urlpatterns = [
    path("ws/chat/<uuid:conversation_id>/", ChatSocketConsumer.as_asgi()),
]

websocket_application = AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
