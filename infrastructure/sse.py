"""Server-Sent Events for both streams, the browser's and the API's: framing, heartbeat,
resume points and response headers, in one place.

The framing functions are pure and tested alone; `response` and `read` are what the two
streaming views share.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from django.http import HttpRequest, StreamingHttpResponse

from inference.streams import MAX_SEQUENCE, StreamEvent, StreamStore

# A comment line after this many seconds of silence keeps proxies from closing the stream.
HEARTBEAT_S = 15.0


def event(data: str | dict[str, Any], *, name: str | None = None, id: int | None = None) -> bytes:
    """One event; multi-line data becomes several data: lines."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    lines = []
    if id is not None:
        lines.append(f"id: {id}")
    if name is not None:
        lines.append(f"event: {name}")
    normalised = text.replace("\r\n", "\n").replace("\r", "\n")
    lines.extend(f"data: {line}" for line in normalised.split("\n"))
    return ("\n".join(lines) + "\n\n").encode()


def comment(text: str) -> bytes:
    """A comment line, with no blank line after it.

    A blank line ends an event. After a comment it ends one with no data, which the
    spec says to drop, but the openai Python client dispatches it once the stream has
    sent an `id:` and then fails to parse its empty data (openai/openai-python#2722).
    """
    return f": {text}\n".encode()


PING = comment("ping")


def resume_point(request: HttpRequest) -> int:
    """The sequence number to resume after: `?after=` wins over `Last-Event-ID`, 0 without
    either. ValueError unless it is an integer from 0 to MAX_SEQUENCE."""
    raw = request.GET.get("after") or request.headers.get("Last-Event-ID") or "0"
    after = int(raw)
    if not 0 <= after <= MAX_SEQUENCE:
        raise ValueError(f"a sequence number is from 0 to {MAX_SEQUENCE}")
    return after


RESUME_POINT_ERROR = f"Last-Event-ID and ?after= must be an integer from 0 to {MAX_SEQUENCE}."


async def read(store: StreamStore, stream_id: str, after: int) -> AsyncIterator[list[StreamEvent]]:
    """The stream's events after `after`, in batches, until the terminal one; an empty batch
    after each HEARTBEAT_S of silence, for the reader to send PING (or look around)."""
    async for batch in store.read(stream_id, after, heartbeat_s=HEARTBEAT_S):
        yield batch


def response(chunks: AsyncIterator[bytes]) -> StreamingHttpResponse:
    """An event stream that no cache or proxy buffers."""
    streaming = StreamingHttpResponse(chunks, content_type="text/event-stream; charset=utf-8")
    streaming["Cache-Control"] = "no-cache"
    streaming["X-Accel-Buffering"] = "no"
    return streaming
