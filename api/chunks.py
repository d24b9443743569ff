"""How a generation reads in OpenAI's formats: chat and text-completion objects and chunks."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from generation import sse
from inference.streams import StreamEvent, coalesced

DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class Completion:
    """How one generation is presented: chat chunks or text-completion chunks."""

    kind: str  # "chat" | "text"
    stream_id: str
    model: str
    created: int

    @classmethod
    def new(cls, kind: str, model: str) -> Completion:
        return cls(kind=kind, stream_id=uuid.uuid4().hex, model=model, created=int(time.time()))

    @property
    def id(self) -> str:
        return f"{'chatcmpl-' if self.kind == 'chat' else 'cmpl-'}{self.stream_id}"

    def chunk(
        self, *, content: str | None = None, role: bool = False, finish_reason: str | None = None
    ) -> dict[str, Any]:
        if self.kind == "chat":
            delta: dict[str, str] = {"role": "assistant"} if role else {}
            if content is not None:
                delta["content"] = content
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish_reason}
            return self._envelope("chat.completion.chunk", [choice])
        return self._envelope(
            "text_completion", [{"index": 0, "text": content or "", "finish_reason": finish_reason, "logprobs": None}]
        )

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        return {
            **self._envelope("chat.completion.chunk" if self.kind == "chat" else "text_completion", []),
            "usage": usage,
        }

    def whole(self, text: str, finish_reason: str, usage: dict[str, int]) -> dict[str, Any]:
        if self.kind == "chat":
            message = {"role": "assistant", "content": text, "refusal": None}
            choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
            return {**self._envelope("chat.completion", [choice]), "usage": usage}
        choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
        return {**self._envelope("text_completion", [choice]), "usage": usage}

    def _envelope(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}


def openai_finish_reason(finish_reason: str) -> str:
    # OpenAI knows stop and length; a cancelled generation stopped where it was asked to.
    return "length" if finish_reason == "length" else "stop"


def status_comment(data: dict[str, Any]) -> bytes:
    """A wait in the queue as a comment line: people reading the raw stream see it, clients skip it."""
    if data.get("state") == "queued":
        return sse.comment(f"queued, {data['ahead']} ahead")
    return sse.comment(str(data.get("state", "status")))


def completion_events(completion: Completion, events: list[StreamEvent], *, include_usage: bool) -> bytes:
    """Format a batch of stream events as OpenAI SSE chunks; consecutive tokens coalesce.

    `status` events become comment lines: OpenAI clients must see no chunk they don't know.
    """
    out: list[bytes] = []
    for event in coalesced(events):
        if event.type == "status":
            out.append(status_comment(event.data))
        elif event.type == "token":
            out.append(sse.event(completion.chunk(content=event.data["delta"]), id=event.seq))
        elif event.type == "done":
            reason = openai_finish_reason(event.data["finish_reason"])
            out.append(sse.event(completion.chunk(finish_reason=reason), id=event.seq))
            if include_usage:
                out.append(sse.event(completion.usage_chunk(event.data["usage"]), id=event.seq))
            out.append(DONE)
        elif event.type == "error":
            error = {
                "message": event.data.get("message", "Generation failed."),
                "type": "server_error",
                "param": None,
                "code": "generation_failed",
            }
            out.append(sse.event({"error": error}, id=event.seq))
            out.append(DONE)
    return b"".join(out)
