"""The browser's SSE stream of one answer, read from the stream store.

Events, each with `id:` = its sequence number: `status` (JSON `{"state": "queued",
"ahead": N}` while the answer waits for room, N generations ahead of it, then
`{"state": "running"}` once it starts; none for an answer that starts at once), `token`
(JSON `{"delta": …}`; consecutive tokens coalesced, `id:` = the last one's), and one
final `done` carrying the saved answer's HTML fragment, which the page swaps in.
`Last-Event-ID` or `?after=` resumes after that event.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.generic.http import AsyncHttpConsumer
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.template.loader import render_to_string

from accounts.models import UsageRecord
from accounts.services import InvalidRequest, QuotaExceeded
from generation import runtime, services
from generation.engine import EngineOverloaded
from generation.forms import PromptForm
from generation.models import Conversation, Message
from generation.streams import StreamEvent, StreamNotFound, coalesced, parse_resume_point, sse_comment, sse_event

logger = logging.getLogger(__name__)

HEARTBEAT_S = 15.0
# Ask EventSource to reconnect after 1 s (instead of its default 3 s) when a connection drops.
SSE_PREAMBLE = b"retry: 1000\n\n"
SSE_HEADERS = [
    (b"Content-Type", b"text/event-stream; charset=utf-8"),
    (b"Cache-Control", b"no-cache"),
    (b"X-Accel-Buffering", b"no"),
]


# The events the page handles itself; the terminal one is rendered by the consumer.
BROWSER_EVENTS = frozenset({"status", "token"})


def answer_events(events: Iterable[StreamEvent]) -> bytes:
    """The status and token events as SSE, in order, one event per run of consecutive tokens."""
    return b"".join(
        sse_event(event.data, event=event.type, id=event.seq)
        for event in coalesced(events)
        if event.type in BROWSER_EVENTS
    )


def resume_point(scope: dict[str, Any]) -> int:
    """The sequence number to resume after: `?after=` wins over `Last-Event-ID`."""
    query = parse_qs(scope.get("query_string", b"").decode())
    headers = dict(scope.get("headers", []))
    raw = query.get("after", [None])[-1] or headers.get(b"last-event-id", b"").decode("latin-1") or "0"
    return parse_resume_point(raw)  # ValueError for junk


class ChatStreamConsumer(AsyncHttpConsumer):
    """Streams one answer to its owner.

    Browser streams keep generating when the reader goes away (a reload resumes
    them); `as_asgi(cancel_on_disconnect=True)` gives API-style streams that stop
    their generation when the client disconnects.
    """

    streaming: asyncio.Task[None] | None = None
    stream_id: str | None = None

    def __init__(self, *, cancel_on_disconnect: bool = False) -> None:
        super().__init__()
        self.cancel_on_disconnect = cancel_on_disconnect

    async def http_request(self, message: dict[str, Any]) -> None:
        # Respond from a task so that http.disconnect still reaches this consumer
        # while the stream is open, and the reader stops when the browser leaves.
        if not message.get("more_body"):
            self.streaming = asyncio.create_task(self._respond_or_close())

    async def disconnect(self) -> None:
        if self.streaming and not self.streaming.done():
            self.streaming.cancel()
            if self.cancel_on_disconnect and self.stream_id:
                await sync_to_async(runtime.stream_store().cancel)(self.stream_id)

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
            await self.send_response(400, b"Last-Event-ID and ?after= must be an integer from 0 to 2**63-1.\n")
            return
        self.stream_id = stream_id
        await self.send_headers(headers=SSE_HEADERS)
        await self.send_body(SSE_PREAMBLE, more_body=True)
        store = runtime.stream_store()
        try:
            async for batch in store.read(stream_id, after, heartbeat_s=HEARTBEAT_S):
                if not batch:
                    if not await sync_to_async(store.producer_alive)(message.producer):
                        raise StreamNotFound(stream_id)  # its producer died: nothing more will come
                    await self.send_body(sse_comment("ping"), more_body=True)
                    continue
                body = answer_events(batch)
                if batch[-1].terminal:
                    body += await self._final_event(message.pk, batch[-1].seq)
                await self.send_body(body, more_body=True)
        except StreamNotFound:
            # The producer is gone (e.g. a restart): settle the answer as it was saved.
            message = await sync_to_async(services.message_mark_interrupted)(message)
            await self.send_body(await self._final_event(message.pk, None), more_body=True)
        await self.send_body(b"")

    async def _final_event(self, message_pk: int, seq: int | None) -> bytes:
        message = await Message.objects.aget(pk=message_pk)
        html = await sync_to_async(render_to_string)("generation/_message.html", {"message": message})
        return sse_event(html, event="done", id=seq)


class ChatSocketConsumer(AsyncJsonWebsocketConsumer):
    """One conversation over a WebSocket: the same streams as SSE, plus cancel.

    In: `{"type": "generate", "prompt": …}`, `{"type": "cancel"}`.
    Out: `{"type": "started", "message_id", "stream_id"}`; while the answer waits for room,
    `{"type": "status", "seq", "state": "queued", "ahead"}` (generations ahead of it) and
    then `{"type": "status", "seq", "state": "running"}`; `{"type": "token", "seq", "delta"}`;
    then `{"type": "done", "seq", …}` or `{"type": "error", "seq"?, "message"}`.
    Closing the socket does not stop the generation (like a browser reload).
    """

    conversation: Conversation | None = None
    stream_id: str | None = None
    relaying: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        user = self.scope["user"]
        conversation_id = self.scope["url_route"]["kwargs"]["conversation_id"]
        if user.is_authenticated:
            self.conversation = await Conversation.objects.filter(id=conversation_id, user=user).afirst()
        if self.conversation is None:
            await self.close(code=4403)  # not logged in, or not your conversation
            return
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.relaying:
            self.relaying.cancel()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            content = json.loads(text_data or "")
        except ValueError:
            await self.send_error("Messages must be JSON objects.")
            return
        if not isinstance(content, dict):
            await self.send_error("Messages must be JSON objects.")
            return
        await self.receive_json(content)

    async def receive_json(self, content: dict[str, Any], **kwargs: Any) -> None:
        kind = content.get("type")
        if kind == "generate":
            await self.generate(content)
        elif kind == "cancel":
            if self.stream_id:
                await sync_to_async(runtime.stream_store().cancel)(self.stream_id)
        else:
            await self.send_error("type must be 'generate' or 'cancel'.")

    async def generate(self, content: dict[str, Any]) -> None:
        if self.relaying and not self.relaying.done():
            await self.send_error("An answer is still being generated; cancel it first.")
            return
        form = PromptForm({"prompt": content.get("prompt") if isinstance(content.get("prompt"), str) else ""})
        if not form.is_valid():
            await self.send_error(" ".join(str(error) for error in form.errors["prompt"]))
            return
        assert self.conversation is not None
        try:
            _, answer = await sync_to_async(services.message_send)(
                conversation=self.conversation, prompt=form.cleaned_data["prompt"], channel=UsageRecord.Channel.WS
            )
        except EngineOverloaded:
            await self.send_error("The server is busy. Try again in a moment.", code="server_overloaded")
            return
        except QuotaExceeded as refusal:
            await self.send_error(refusal.message, code=refusal.code)
            return
        except InvalidRequest as invalid:
            await self.send_error(invalid.message, code=invalid.code or "invalid_request")
            return
        self.stream_id = answer.stream_id
        await self.send_json({"type": "started", "message_id": answer.pk, "stream_id": answer.stream_id})
        self.relaying = asyncio.create_task(self.relay(answer.stream_id or ""))

    async def relay(self, stream_id: str) -> None:
        async for batch in runtime.stream_store().read(stream_id):
            for event in batch:
                await self.send_json({"type": event.type, "seq": event.seq, **event.data})

    async def send_error(self, message: str, *, code: str = "invalid_request") -> None:
        await self.send_json({"type": "error", "code": code, "message": message})
