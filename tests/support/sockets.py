"""WebSocket connections to a conversation's socket, as a browser on the site makes them."""

from __future__ import annotations

from channels.testing import WebsocketCommunicator

from generation import routing

ORIGIN = (b"origin", b"http://localhost")


def socket(conversation_id, headers) -> WebsocketCommunicator:
    application = routing.websocket_application
    return WebsocketCommunicator(application, f"/ws/chat/{conversation_id}/", headers=headers)
