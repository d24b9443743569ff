"""The WebSocket chat: one conversation's answers over a socket, with cancel."""

from __future__ import annotations

import asyncio
from typing import Any

from asgiref.sync import sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from accounts.models import UsageRecord
from generation import connection_limits, services, untrusted_json
from generation.backends import runtime
from generation.connection_limits import Held, MessageRate, TooManyConnections, Verdict
from generation.forms import PromptForm
from generation.models import Conversation
from generation.refusals import REFUSALS, refusal_of

# The socket's user holds CHAT_MAX_SOCKETS_PER_USER already (HTTP's 429, in the range
# RFC 6455 leaves to applications).
TOO_MANY_SOCKETS = 4429
# Its client kept sending faster than CHAT_SOCKET_MESSAGES_PER_S after being told.
POLICY_VIOLATION = 1008


class ChatSocketConsumer(AsyncJsonWebsocketConsumer):
    """One conversation over a WebSocket: the same streams as SSE, plus cancel.

    In: `{"type": "generate", "prompt": …}`, `{"type": "cancel"}`.
    Out: `{"type": "started", "message_id", "stream_id"}`; while the answer waits for room,
    `{"type": "status", "seq", "state": "queued", "ahead"}` (generations ahead of it) and
    then `{"type": "status", "seq", "state": "running"}`; `{"type": "token", "seq", "delta"}`;
    then `{"type": "done", "seq", …}` or `{"type": "error", "seq"?, "message"}`.
    Closing the socket does not stop the generation (like a browser reload).

    Limits (generation.connection_limits): past CHAT_MAX_SOCKETS_PER_USER open sockets a
    new one gets an error (`too_many_connections`) and is closed with 4429; messages over
    the rate get one error (`rate_limit_exceeded`), and a flood that goes on is closed
    with 1008.
    """

    conversation: Conversation | None = None
    stream_id: str | None = None
    relaying: asyncio.Task[None] | None = None
    held: Held | None = None
    rate: MessageRate
    closing = False  # closed by us: what the client still sends is dropped unread

    async def connect(self) -> None:
        user = self.scope["user"]
        conversation_id = self.scope["url_route"]["kwargs"]["conversation_id"]
        self.rate = MessageRate.from_settings()
        if user.is_authenticated:
            self.conversation = await Conversation.objects.filter(id=conversation_id, user=user).afirst()
        if self.conversation is None:
            await self.close(code=4403)  # not logged in, or not your conversation
            return
        try:
            self.held = connection_limits.sockets.hold(user.pk)
        except TooManyConnections as error:
            # Accepted, told and closed, rather than refused: a refused handshake reaches
            # a browser as a bare 1006, with nothing to say why.
            await self.accept()
            refusal = refusal_of(error)
            await self.send_error(refusal.words, code=refusal.code or "too_many_connections")
            await self._close(TOO_MANY_SOCKETS)
            return
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.relaying:
            self.relaying.cancel()
        if self.held:
            self.held.release()

    async def websocket_receive(self, message: dict[str, Any]) -> None:
        """Each message is counted against the socket's rate before it is read at all, so
        that a flood costs little and is answered at the rate, not at the flood's pace."""
        if self.closing:
            return
        verdict = self.rate.check()
        if verdict is Verdict.ACCEPT:
            await super().websocket_receive(message)
        elif verdict is Verdict.WARN:
            await self.send_error(self.rate.words, code="rate_limit_exceeded")
        elif verdict is Verdict.CLOSE:
            await self._close(POLICY_VIOLATION)

    async def _close(self, code: int) -> None:
        self.closing = True
        await self.close(code=code)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            content = untrusted_json.parse(text_data or "")
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
                await sync_to_async(services.generation_cancel)(stream_id=self.stream_id)
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
        except REFUSALS as error:
            refusal = refusal_of(error)
            await self.send_error(refusal.words, code=refusal.code or "invalid_request")
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
