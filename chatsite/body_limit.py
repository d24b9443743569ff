"""Request bodies over DATA_UPLOAD_MAX_MEMORY_SIZE are refused before they are read.

That setting is the one limit (the API's `_parse` enforces it too); None turns both
guards off. A refusal is a 413: the API's error object under /v1/, plain text elsewhere.

- `BodyLimit`, ASGI middleware in front of Django: a Content-Length over the limit is
  refused without one `receive`, and a body without it (chunked) is cut off as soon as
  it passes the limit; Django, which reads a whole body before the view, never sees it.
- Under daphne that comes too late: Twisted receives a request's whole body (into a
  temporary file) before daphne calls the application, and daphne then queues all of it
  for the application at once. Measured: a 300 MB POST to an application that never
  read it took daphne's RSS from 55 to 371 MB. `LimitedWebRequest`, put in place of
  daphne's request class by `install_in_daphne()`, refuses in the HTTP layer itself: by
  Content-Length as soon as the headers are in, and as a chunked body passes the limit.
  It answers and closes the connection, as Twisted does with the bad requests it refuses
  itself. daphne offers no setting for this; its request class is a module global that
  its protocol factory reads for every connection. It also leaves a POST's form body
  unparsed: daphne passes the raw body on and never reads Twisted's parse, and Twisted
  answers a multipart body it cannot parse with a bare 400, no error object, no log line.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from daphne import http_protocol
from django.conf import settings

from api.errors import body_too_large, is_api_path
from infrastructure import logs

logger = logging.getLogger(__name__)


def body_limit() -> int | None:
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE


def refusal(path: str, limit: int) -> tuple[bytes, bytes]:
    """The 413's content type and body for a request to `path` (its root path removed)."""
    if is_api_path(path):
        return b"application/json", json.dumps(body_too_large(limit).body()).encode()
    return b"text/plain; charset=utf-8", f"Request body too large: at most {limit} bytes.\n".encode()


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name.lower() == b"content-length":
            return int(value) if value.strip().isdigit() else None
    return None


class BodyLimit:
    """ASGI middleware: refuse a body over the limit before the application reads it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        limit = body_limit()
        if scope["type"] != "http" or limit is None:
            await self.app(scope, receive, send)
            return
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        length = _content_length(scope["headers"])
        if length is not None and length > limit:
            await self._refuse(send, path, limit)
            return
        received, refused = 0, False

        async def limited_receive() -> dict[str, Any]:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # The application sees the client go away (Django then drops the
                    # request) while the client gets the 413.
                    refused = True
                    await self._refuse(send, path, limit)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: dict[str, Any]) -> None:
            if not refused:
                await send(message)

        await self.app(scope, limited_receive, guarded_send)

    @staticmethod
    async def _refuse(send: Any, path: str, limit: int) -> None:
        content_type, body = refusal(path, limit)
        headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": [*headers, (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


class LimitedWebRequest(http_protocol.WebRequest):
    """daphne's request, refusing a body over the limit as it arrives (see the module's docstring)."""

    _refused = False
    _received = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Django parses forms, and the API reads JSON (a bad body is its 400 error object).
        super().__init__(*args, parsePOSTFormSubmission=False, **kwargs)

    def gotLength(self, length: int | None) -> None:
        super().gotLength(length)
        limit = body_limit()
        if length is not None and limit is not None and length > limit:
            self._refuse(limit)

    def handleContentChunk(self, data: bytes) -> None:
        if self._refused:
            return
        self._received += len(data)
        limit = body_limit()
        if limit is not None and self._received > limit:
            self._refuse(limit)
            return
        super().handleContentChunk(data)

    def process(self) -> Any:
        # A refused request can still come to an end in the bytes already received.
        return None if self._refused else super().process()

    def _refuse(self, limit: int) -> None:
        self._refused = True
        # Twisted answers "Expect: 100-continue" after gotLength: not to a refused request.
        self.requestHeaders.removeHeader(b"expect")
        raw_path = getattr(self.channel, "_path", b"").split(b"?")[0].decode("latin-1")
        root_path = self.server.root_path or ""
        content_type, body = refusal(raw_path.removeprefix(root_path), limit)
        # Refused before the application, and its request log: the id is given here.
        given = self.requestHeaders.getRawHeaders(b"x-request-id", [b""])[0].decode("latin-1")
        request_id = logs.new_request_id(given)
        head = (
            f"HTTP/1.1 413 Content Too Large\r\ncontent-length: {len(body)}\r\nconnection: close\r\n"
            f"x-request-id: {request_id}\r\n"
        )
        self.channel.transport.write(head.encode() + b"content-type: " + content_type + b"\r\n\r\n" + body)
        self.channel.loseConnection()
        logger.warning(
            "Refused a request body over %s bytes from %s",
            limit,
            self.getClientAddress(),
            extra={"request_id": request_id, "path": raw_path, "status": 413},
        )


def install_in_daphne() -> None:
    """Make daphne build every HTTP request as a LimitedWebRequest."""
    http_protocol.WebRequest = LimitedWebRequest
