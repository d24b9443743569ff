"""The WebSocket chat: one conversation's answers over a socket, with cancel."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from asgiref.sync import sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from accounts.models import UsageRecord
from generation import runtime, services
from generation.forms import PromptForm
from generation.models import Conversation
from generation.refusals import REFUSALS, refusal_of


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
