"""How a generation reads in OpenAI's Responses format: the response object and its stream events.

Pure functions of the stream store's events. A streamed response's events are numbered
(`sequence_number`) from the start of its generation, always the same way, so a reader that
resumes after event N (`starting_after`) replays the numbering and sends what comes after N:
no gap, no repeat.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from inference.streams import GenerationStatus, StreamEvent
from infrastructure import sse

RESPONSE_PREFIX = "resp_"


@dataclass(frozen=True)
class ResponseHead:
    """What a response is before it has an answer: what the request asked for."""

    stream_id: str
    model: str
    created_at: int
    instructions: str | None = None
    previous_response_id: str | None = None
    # temperature, top_p, max_output_tokens, metadata, background: as the request gave them.
    params: dict[str, Any] = field(default_factory=dict)
    store: bool = True

    @property
    def id(self) -> str:
        return f"{RESPONSE_PREFIX}{self.stream_id}"

    @property
    def message_id(self) -> str:
        return f"msg_{self.stream_id}"


@dataclass(frozen=True)
class ResponseOutcome:
    """Where a response's generation stands, from its events."""

    status: str = "in_progress"  # completed | incomplete | cancelled | failed | in_progress
    text: str = ""
    usage: dict[str, Any] | None = None  # the generation's: prompt, completion and total tokens, details
    error: dict[str, Any] | None = None  # {code, message}
    incomplete_reason: str | None = None
    completed_at: int | None = None

    @property
    def finished(self) -> bool:
        return self.status != "in_progress"


def outcome_after(outcome: ResponseOutcome, event: StreamEvent, *, created_at: int) -> ResponseOutcome:
    """The outcome once `event` is known; status and tool events change nothing.

    Its end time is reckoned from the response's creation and the generation's duration, not
    read from a clock, so that each replay of the events tells the same."""
    if event.type == "token":
        return replace(outcome, text=outcome.text + event.data["delta"])
    if event.type == "done":
        status, reason = "completed", None
        if event.data.get("status") == GenerationStatus.STOPPED:
            status = "cancelled"
        elif event.data.get("finish_reason") == "length":
            status, reason = "incomplete", "max_output_tokens"
        return replace(
            outcome,
            status=status,
            usage=event.data["usage"],
            incomplete_reason=reason,
            completed_at=created_at + math.ceil((event.data.get("timings") or {}).get("duration_ms", 0) / 1000),
        )
    if event.type == "error":
        code, message = event.data.get("code") or "server_error", event.data.get("message") or "Failed."
        return failed(outcome, code, message, at=created_at)
    return outcome


def failed(outcome: ResponseOutcome, code: str, message: str, *, at: int | None = None) -> ResponseOutcome:
    ended = int(time.time()) if at is None else at
    return replace(outcome, status="failed", error={"code": code, "message": message}, completed_at=ended)


def outcome_of(events: Iterable[StreamEvent], *, created_at: int) -> ResponseOutcome:
    outcome = ResponseOutcome()
    for event in events:
        outcome = outcome_after(outcome, event, created_at=created_at)
    return outcome


def response_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage["total_tokens"],
    }


def output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def output_message(head: ResponseHead, outcome: ResponseOutcome) -> dict[str, Any]:
    status = "completed" if outcome.status == "completed" else "incomplete" if outcome.finished else "in_progress"
    content = [output_text_part(outcome.text)] if outcome.finished else []
    return {"id": head.message_id, "type": "message", "role": "assistant", "status": status, "content": content}


def response_object(head: ResponseHead, outcome: ResponseOutcome) -> dict[str, Any]:
    """The `response` object, as OpenAI's `responses.create` and `responses.retrieve` answer it."""
    params = head.params
    output = [output_message(head, outcome)] if outcome.finished and (outcome.text or not outcome.error) else []
    return {
        "id": head.id,
        "object": "response",
        "created_at": head.created_at,
        "status": outcome.status,
        "background": bool(params.get("background")),
        "completed_at": outcome.completed_at,
        "error": outcome.error,
        "incomplete_details": {"reason": outcome.incomplete_reason} if outcome.incomplete_reason else None,
        "instructions": head.instructions,
        "max_output_tokens": params.get("max_output_tokens"),
        "metadata": params.get("metadata") or {},
        "model": head.model,
        "output": output,
        "parallel_tool_calls": False,
        "previous_response_id": head.previous_response_id,
        "service_tier": "default",
        "store": head.store,
        "temperature": params.get("temperature"),
        "text": {"format": {"type": "text"}},
        "tool_choice": "none",
        "tools": [],
        "top_p": params.get("top_p"),
        "truncation": "disabled",
        "usage": response_usage(outcome.usage),
        "user": None,
    }


class ResponseEvents:
    """A response's stream events, numbered from 0, from its generation's events in order."""

    def __init__(self, head: ResponseHead) -> None:
        self.head = head
        self.outcome = ResponseOutcome()
        self._next = 0

    def opening(self) -> list[dict[str, Any]]:
        """What comes before the first token: the response, its message and the message's text part."""
        head = self.head
        return [
            self._event("response.created", response=response_object(head, self.outcome)),
            self._event("response.in_progress", response=response_object(head, self.outcome)),
            self._event("response.output_item.added", output_index=0, item=output_message(head, self.outcome)),
            self._event(
                "response.content_part.added", **self._place(), part={**output_text_part(""), "logprobs": None}
            ),
        ]

    def take(self, event: StreamEvent) -> list[dict[str, Any]]:
        """The events that `event` of the generation stands for (none for a status event)."""
        self.outcome = outcome_after(self.outcome, event, created_at=self.head.created_at)
        if event.type == "token":
            return [self._event("response.output_text.delta", **self._place(), delta=event.data["delta"], logprobs=[])]
        if event.type in ("done", "error"):
            return self.closing()
        return []

    def fail(self, code: str, message: str) -> list[dict[str, Any]]:
        """The end of a stream whose generation can no longer be read (expired, its store gone)."""
        self.outcome = failed(self.outcome, code, message)
        return self.closing()

    def closing(self) -> list[dict[str, Any]]:
        head, outcome = self.head, self.outcome
        response = response_object(head, outcome)
        if outcome.status == "failed":
            return [self._event("response.failed", response=response)]
        part = output_text_part(outcome.text)
        return [
            self._event("response.output_text.done", **self._place(), text=outcome.text, logprobs=[]),
            self._event("response.content_part.done", **self._place(), part=part),
            self._event("response.output_item.done", output_index=0, item=output_message(head, outcome)),
            self._event(
                "response.completed" if outcome.status == "completed" else "response.incomplete", response=response
            ),
        ]

    def _place(self) -> dict[str, Any]:
        return {"item_id": self.head.message_id, "output_index": 0, "content_index": 0}

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._next, **fields}
        self._next += 1
        return event


def response_sse(events: list[dict[str, Any]], *, after: int = -1) -> bytes:
    """Server-sent events of those after sequence number `after`: `id:` the number, `event:` the type."""
    return b"".join(
        sse.event(event, name=event["type"], id=event["sequence_number"])
        for event in events
        if event["sequence_number"] > after
    )
