"""The browser's SSE stream of one answer, read from the stream store.

Events: `token` (JSON `{"delta": …}`, consecutive tokens coalesced, `id:` = last
sequence number) and one final `done` carrying the saved answer's HTML fragment,
which the page swaps in. `Last-Event-ID` or `?after=` resumes after that event.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.generic.http import AsyncHttpConsumer
from django.template.loader import render_to_string

from generation import runtime, services
from generation.models import Message
from generation.streams import StreamEvent, StreamNotFound, sse_comment, sse_event

logger = logging.getLogger(__name__)

HEARTBEAT_S = 15.0
SSE_HEADERS = [
    (b"Content-Type", b"text/event-stream; charset=utf-8"),
    (b"Cache-Control", b"no-cache"),
    (b"X-Accel-Buffering", b"no"),
]


def token_events(events: Iterable[StreamEvent]) -> bytes:
    """Coalesce consecutive token events into one SSE event each run."""
    out: list[bytes] = []
    run: list[StreamEvent] = []

    def flush() -> None:
        if run:
            delta = "".join(e.data["delta"] for e in run)
            out.append(sse_event({"delta": delta}, event="token", id=run[-1].seq))
            run.clear()

    for event in events:
        if event.type == "token":
            run.append(event)
        else:
            flush()
    flush()
    return b"".join(out)


def resume_point(scope: dict[str, Any]) -> int:
    """The sequence number to resume after: `?after=` wins over `Last-Event-ID`."""
    query = parse_qs(scope.get("query_string", b"").decode())
    headers = dict(scope.get("headers", []))
    raw = query.get("after", [None])[-1] or headers.get(b"last-event-id", b"").decode() or "0"
    after = int(raw)  # ValueError for junk
    if after < 0:
        raise ValueError("negative sequence number")
    return after


class ChatStreamConsumer(AsyncHttpConsumer):
    streaming: asyncio.Task[None] | None = None

    async def http_request(self, message: dict[str, Any]) -> None:
        # Respond from a task so that http.disconnect still reaches this consumer
        # while the stream is open, and the reader stops when the browser leaves.
        if not message.get("more_body"):
            self.streaming = asyncio.create_task(self._respond_or_close())

    async def disconnect(self) -> None:
        if self.streaming and not self.streaming.done():
            self.streaming.cancel()

    async def _respond_or_close(self) -> None:
        try:
            await self.respond()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("Chat stream failed")
            await self.send_body(b"")  # end the response rather than leave it hanging

    async def respond(self) -> None:
        user = self.scope["user"]
        if not user.is_authenticated:
            await self.send_response(403, b"Log in to read this stream.\n")
            return
        stream_id = self.scope["url_route"]["kwargs"]["stream_id"]
        message = await Message.objects.filter(stream_id=stream_id, conversation__user=user).afirst()
        if message is None:
            await self.send_response(404, b"No such stream.\n")
            return
        try:
            after = resume_point(self.scope)
        except ValueError:
            await self.send_response(400, b"Last-Event-ID and ?after= must be a non-negative integer.\n")
            return
        await self.send_headers(headers=SSE_HEADERS)
        try:
            async for batch in runtime.stream_store().read(stream_id, after, heartbeat_s=HEARTBEAT_S):
                if not batch:
                    await self.send_body(sse_comment("ping"), more_body=True)
                    continue
                body = token_events(batch)
                if batch[-1].terminal:
                    body += await self._final_event(message.pk, batch[-1].seq)
                await self.send_body(body, more_body=True)
        except StreamNotFound:
            # The producer is gone with its stream (e.g. a restart): settle the answer.
            message = await sync_to_async(services.message_mark_interrupted)(message)
            await self.send_body(await self._final_event(message.pk, None), more_body=True)
        await self.send_body(b"")

    async def _final_event(self, message_pk: int, seq: int | None) -> bytes:
        message = await Message.objects.aget(pk=message_pk)
        html = await sync_to_async(render_to_string)("generation/_message.html", {"message": message})
        return sse_event(html, event="done", id=seq)
