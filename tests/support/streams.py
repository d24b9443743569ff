"""Streams of answers through Django's ASGI handler: session headers, GETs, and SSE bodies parsed."""

from __future__ import annotations

from channels.testing import ApplicationCommunicator
from django.conf import settings
from django.core.asgi import get_asgi_application

from generation import services
from generation.models import Message

# Django's ASGI handler, as chatsite.asgi mounts it, without its start-up side effects.
application = get_asgi_application()


def session_headers(client) -> list[tuple[bytes, bytes]]:
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    return [(b"cookie", cookie.encode()), (b"host", b"localhost")]


async def get_stream(
    path: str, headers: list[tuple[bytes, bytes]], timeout: float = 30, *, handler=application
) -> dict:
    """GET through Django's ASGI handler (or another): the response's status, headers and whole body."""
    path, _, query = path.partition("?")
    scope = {"type": "http", "method": "GET", "path": path, "query_string": query.encode(), "headers": headers}
    communicator = ApplicationCommunicator(handler, scope)
    try:
        await communicator.send_input({"type": "http.request", "body": b""})
        response = await communicator.receive_output(timeout)
        response["body"] = b""
        while True:
            chunk = await communicator.receive_output(timeout)
            response["body"] += chunk.get("body", b"")  # Django's last message may carry none
            if not chunk.get("more_body"):
                return response
    finally:
        # As daphne does once a response is complete.
        await communicator.send_input({"type": "http.disconnect"})
        await communicator.wait()


def parse_sse(body: bytes) -> list[dict]:
    events = []
    for block in body.decode().split("\n\n"):
        fields: dict = {"data": []}
        for line in block.splitlines():
            name, _, value = line.partition(": ")
            if name == "data":
                fields["data"].append(value)
            elif name in ("id", "event"):
                fields[name] = value
        if fields["data"]:
            fields["data"] = "\n".join(fields["data"])
            events.append(fields)
    return events


def answer_in_new_conversation(user, *, max_tokens: int) -> Message:
    conversation = services.conversation_create(user=user)
    conversation.max_tokens = max_tokens
    conversation.save(update_fields=["max_tokens"])
    return services.message_send(conversation=conversation, prompt="Hello there")[1]
