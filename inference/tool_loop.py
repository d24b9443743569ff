"""The tool loop's parts that know no tool server: the calls a model streams, gathered; what
running one gave; who runs them (`ToolRunner`, given by the app); the messages that carry
the results back to the model; and the events that show each call.

A model's round that ends in tool calls is followed by another: the assistant message with
its calls and one `tool` message per result are appended, and the model continues, for at
most `ToolRunner.max_rounds` rounds of calls. The round after the last one asks for text
(`tool_choice: "none"`): an answer never ends on calls nobody ran.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

# A call waits for its user's Approve ("waiting") where they asked to be asked.
ToolStatus = Literal["waiting", "running", "ok", "error"]


@dataclass(frozen=True)
class ToolCall:
    """One call a model asked for: its id, the tool's name and its arguments (JSON text, as sent)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolOutcome:
    """What a call gave: its text for the model, or an error text (`ok` False) told to it alike."""

    ok: bool
    text: str
    duration_s: float = 0.0


class ToolRunner(Protocol):
    """Runs a generation's tool calls (the app's, which knows the tool servers and saves each call)."""

    @property
    def max_rounds(self) -> int: ...

    async def run(self, call: ToolCall, *, round_number: int, tell: Callable[[ToolStatus], None]) -> ToolOutcome:
        """Run one call of round `round_number` (from 1); never raises for the tool's
        failures (they are an outcome's text). `tell` announces a change of the call's
        status before its outcome (waiting for approval, then running)."""
        ...


@dataclass
class ToolCallGatherer:
    """A round's tool calls, gathered from OpenAI-style deltas (`id` and name in the first of
    each index, arguments in pieces)."""

    round: int = 1
    _calls: dict[int, dict[str, str]] = field(default_factory=dict)

    def add(self, deltas: list[dict[str, Any]]) -> None:
        for delta in deltas:
            index = int(delta.get("index", 0))
            call = self._calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
            function = delta.get("function") or {}
            call["id"] = call["id"] or str(delta.get("id") or "")
            call["name"] = call["name"] or str(function.get("name") or "")
            call["arguments"] += str(function.get("arguments") or "")

    def calls(self) -> list[ToolCall]:
        """The calls, in index order; a call without an id gets one (not every server sends it)."""
        return [
            ToolCall(call["id"] or f"call_{self.round}_{index}", call["name"], call["arguments"])
            for index, call in sorted(self._calls.items())
        ]

    def clear(self) -> None:
        self._calls = {}
        self.round += 1


def tool_round_messages(text: str, calls: list[ToolCall], outcomes: list[ToolOutcome]) -> list[dict[str, Any]]:
    """What a round of calls appends to the conversation: the assistant's message with its
    calls, then each result as a `tool` message answering its call's id."""
    assistant: dict[str, Any] = {
        "role": "assistant",
        # A string even when empty: OpenAI takes null too, llama.cpp's server only a string.
        "content": text,
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
        ],
    }
    results = [
        {"role": "tool", "tool_call_id": call.id, "content": outcome.text}
        for call, outcome in zip(calls, outcomes, strict=True)
    ]
    return [assistant, *results]


def next_round_body(body: dict[str, Any], added: list[dict[str, Any]], *, last: bool) -> dict[str, Any]:
    """The request of the round after a round of calls: the messages so far and `added`. A
    tool_choice that named a tool, or required one, held for the first round only (it would
    call for ever); the round after the last one allowed asks for text."""
    following = {**body, "messages": [*body["messages"], *added]}
    if last:
        following["tool_choice"] = "none"
    elif "tool_choice" in body:
        following["tool_choice"] = "auto"
    return following


def arguments_shown(arguments: str) -> str:
    """A call's arguments as text for people: indented JSON when they are JSON, else as sent."""
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except ValueError:
        return arguments


def tool_event(
    call: ToolCall, outcome: ToolOutcome | None, *, round_number: int, status: ToolStatus = "running"
) -> dict[str, Any]:
    """A `tool_start` (no outcome yet: `status`) or `tool_result` event's data: one block of the answer."""
    if outcome is not None:
        status = "ok" if outcome.ok else "error"
    data: dict[str, Any] = {"id": call.id, "name": call.name, "arguments": call.arguments, "status": status}
    data["round"] = round_number
    if outcome is not None:
        data["result"] = outcome.text
        data["duration_ms"] = max(0, round(outcome.duration_s * 1000))
    return data
