"""How a generation reads in OpenAI's formats: chat and text-completion objects and chunks."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from accounts.prices import cost_text
from inference.streams import StreamEvent, coalesced
from infrastructure import sse

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
        self,
        *,
        content: str | None = None,
        role: bool = False,
        finish_reason: str | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
        logprobs: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        logprobs_field = {"content": logprobs} if logprobs else None
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if content is not None:
                delta["content"] = content
            if tool_calls:
                delta["tool_calls"] = tool_calls
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish_reason}
            if logprobs_field:
                choice["logprobs"] = logprobs_field
            return self._envelope("chat.completion.chunk", [choice])
        return self._envelope(
            "text_completion", [{"index": 0, "text": content or "", "finish_reason": finish_reason, "logprobs": None}]
        )

    def usage_chunk(self, usage: dict[str, Any], cost: tuple[Decimal, str] | None = None) -> dict[str, Any]:
        """The usage chunk; with the request's cost and its currency as fields of ours, if priced."""
        priced: dict[str, Any] = dict(usage)
        if cost is not None:
            priced |= {"cost": cost_text(cost[0]), "currency": cost[1]}
        return {
            **self._envelope("chat.completion.chunk" if self.kind == "chat" else "text_completion", []),
            "usage": priced,
        }

    def whole(self, answer: WholeAnswer, finish_reason: str, usage: dict[str, Any]) -> dict[str, Any]:
        text = "".join(answer.pieces)
        logprobs = {"content": answer.logprobs} if answer.logprobs else None
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
            if answer.tool_calls:
                message["tool_calls"] = [answer.tool_calls[index] for index in sorted(answer.tool_calls)]
                message["content"] = text or None
            choice: dict[str, Any] = {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason,
                "logprobs": logprobs,
            }
            return {**self._envelope("chat.completion", [choice]), "usage": usage}
        choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
        return {**self._envelope("text_completion", [choice]), "usage": usage}

    def _envelope(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}


@dataclass
class WholeAnswer:
    """A generation's events gathered into one answer (a non-streaming completion)."""

    pieces: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)  # by their index
    logprobs: list[dict[str, Any]] = field(default_factory=list)

    def take(self, event: StreamEvent) -> None:
        if event.type == "token":
            self.pieces.append(event.data["delta"])
            self.logprobs += event.data.get("logprobs", [])
        elif event.type == "tool_call":
            for delta in event.data["tool_calls"]:
                call = self.tool_calls.setdefault(
                    delta.get("index", 0), {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                call["id"] = delta.get("id") or call["id"]
                function = delta.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""


# What OpenAI clients know; a cancelled generation stopped where it was asked to.
OPENAI_FINISH_REASONS = frozenset({"stop", "length", "tool_calls", "content_filter"})


def openai_finish_reason(finish_reason: str) -> str:
    return finish_reason if finish_reason in OPENAI_FINISH_REASONS else "stop"


def error_of(data: dict[str, Any]) -> dict[str, Any]:
    """An `error` event's data as OpenAI's error object."""
    return {
        "message": data.get("message", "Generation failed."),
        "type": "server_error",
        "param": None,
        "code": data.get("code", "generation_failed"),
    }


def status_comment(data: dict[str, Any]) -> bytes:
    """A wait in the queue as a comment line: people reading the raw stream see it, clients skip it."""
    if data.get("state") == "queued":
        return sse.comment(f"queued, {data['ahead']} ahead")
    if data.get("state") == "loading":  # freed while idle (CHAT_MODEL_IDLE_UNLOAD_S), loaded again
        return sse.comment("loading model")
    return sse.comment(str(data.get("state", "status")))


def completion_events(
    completion: Completion,
    events: list[StreamEvent],
    *,
    include_usage: bool,
    cost: tuple[Decimal, str] | None = None,
) -> bytes:
    """Format a batch of stream events as OpenAI SSE chunks; consecutive tokens coalesce.

    `status` events become comment lines: OpenAI clients must see no chunk they don't know.
    `cost` (the settled request's, and its currency) goes in the usage chunk.
    """
    out: list[bytes] = []
    for event in coalesced(events):
        if event.type == "status":
            out.append(status_comment(event.data))
        elif event.type == "token":
            chunk = completion.chunk(content=event.data["delta"], logprobs=event.data.get("logprobs"))
            out.append(sse.event(chunk, id=event.seq))
        elif event.type == "tool_call":
            out.append(sse.event(completion.chunk(tool_calls=event.data["tool_calls"]), id=event.seq))
        elif event.type == "done":
            reason = openai_finish_reason(event.data["finish_reason"])
            out.append(sse.event(completion.chunk(finish_reason=reason), id=event.seq))
            if include_usage:
                out.append(sse.event(completion.usage_chunk(event.data["usage"], cost), id=event.seq))
            out.append(DONE)
        elif event.type == "error":
            out.append(sse.event({"error": error_of(event.data)}, id=event.seq))
            out.append(DONE)
    return b"".join(out)
