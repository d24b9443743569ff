"""The tool loop on a model-server pool: a scripted model server (real HTTP) asks for tools,
a real MCP tool server runs them, and the answer goes on with their results, for a
bounded number of rounds."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from inference.engine import Job
from inference.streams import InMemoryStreamStore, StreamEvent
from inference.tool_loop import (
    ToolCall,
    ToolCallGatherer,
    ToolOutcome,
    next_round_body,
    tool_event,
    tool_round_messages,
)
from inference.upstream import UpstreamPool, endpoint_from_json
from tests.support.engines import wait_for_terminal, wait_until
from tests.support.mcp_server import MCPToolServer
from tests.support.upstreams import ScriptedServer, event_stream
from tools.mcp_client import ToolServerConfig, tool_call

ASK = [{"role": "user", "content": "What is 2 + 40?"}]
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


@pytest.fixture(scope="module")
def mcp_server() -> Iterator[MCPToolServer]:
    with MCPToolServer() as server:
        yield server


@dataclass
class McpRunner:
    """A ToolRunner that calls the test's MCP server, and notes each call."""

    server: ToolServerConfig
    max_rounds: int = 4
    calls: list[tuple[int, ToolCall]] = field(default_factory=list)

    async def run(self, call: ToolCall, *, round_number: int, tell: object) -> ToolOutcome:
        self.calls.append((round_number, call))
        return await tool_call(self.server, call.name, call.arguments)


def call_chunks(name: str, arguments: str, call_id: str = "call_1") -> list[dict[str, object]]:
    """A tool call as llama.cpp streams it: id and name, then the arguments in two pieces."""
    first = {"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
    return [
        {"choices": [{"index": 0, "delta": {"tool_calls": [first]}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": arguments[:3]}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": arguments[3:]}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]


def text_chunks(text: str) -> list[dict[str, object]]:
    return [{"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}]}]


def run_with_tools(upstream: ScriptedServer, runner: McpRunner, *, max_tokens: int = 200) -> list[StreamEvent]:
    store = InMemoryStreamStore()
    pool = UpstreamPool(store, health_interval_s=60)
    endpoint = {"model": "remote", "base_url": upstream.base_url, "upstream_model": "m"}
    pool.configure([endpoint_from_json(endpoint, "e")])
    body = {"messages": ASK, "tools": [ADD], "tool_choice": "required", "max_tokens": max_tokens}
    try:
        pool.submit(Job("s1", ASK), model="remote", prompt_tokens=10, body=body, tools=runner)
        return wait_for_terminal(store, "s1", timeout=30)
    finally:
        pool.shut_down(1)


def test_a_tool_call_is_run_its_result_told_to_the_model_and_the_answer_goes_on(mcp_server):
    bodies: list[dict[str, object]] = []

    async def model_server(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        if len(bodies) == 1:
            return event_stream(call_chunks("add", '{"a": 2, "b": 40}'))
        return event_stream(text_chunks("It is 42."))

    runner = McpRunner(ToolServerConfig("tests", mcp_server.url))
    with ScriptedServer(model_server) as upstream:
        events = run_with_tools(upstream, runner)

    kinds = [e.type for e in events]
    assert kinds == ["tool_start", "tool_result", "token", "done"]
    start, result = events[0].data, events[1].data
    assert start == {"id": "call_1", "name": "add", "arguments": '{"a": 2, "b": 40}', "status": "running", "round": 1}
    assert result["status"] == "ok"
    assert result["result"] == "42"
    assert result["duration_ms"] >= 0
    assert events[2].data["delta"] == "It is 42."
    assert events[-1].data["finish_reason"] == "stop"
    # The second round carries the call and its result; the forced choice held for the first only.
    second = bodies[1]
    assert second["messages"][1]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 2, "b": 40}'}
    assert second["messages"][2] == {"role": "tool", "tool_call_id": "call_1", "content": "42"}
    assert second["tool_choice"] == "auto"
    assert second["max_tokens"] == 200 - 3  # the first round's three chunks with output


def test_the_loop_stops_after_its_rounds_and_asks_the_model_for_text(mcp_server):
    bodies: list[dict[str, object]] = []

    async def model_server(request: web.Request) -> web.Response:
        body = await request.json()
        bodies.append(body)
        if body.get("tool_choice") == "none":
            return event_stream(text_chunks("Enough sums."))
        return event_stream(call_chunks("add", '{"a": 1, "b": 1}', call_id=f"call_{len(bodies)}"))

    runner = McpRunner(ToolServerConfig("tests", mcp_server.url), max_rounds=2)
    with ScriptedServer(model_server) as upstream:
        events = run_with_tools(upstream, runner)

    assert [round_number for round_number, _ in runner.calls] == [1, 2]
    assert len(bodies) == 3
    assert bodies[-1]["tool_choice"] == "none"
    assert [e.data["round"] for e in events if e.type == "tool_result"] == [1, 2]
    assert "".join(e.data["delta"] for e in events if e.type == "token") == "Enough sums."
    assert events[-1].type == "done"


def test_a_model_that_calls_tools_regardless_is_not_run_past_the_rounds(mcp_server):
    requests = 0

    async def model_server(request: web.Request) -> web.Response:
        nonlocal requests
        requests += 1
        return event_stream(call_chunks("add", '{"a": 1, "b": 1}'))  # even when told "none"

    runner = McpRunner(ToolServerConfig("tests", mcp_server.url), max_rounds=1)
    with ScriptedServer(model_server) as upstream:
        events = run_with_tools(upstream, runner)

    assert len(runner.calls) == 1
    assert requests == 2
    assert events[-1].type == "done"
    assert events[-1].data["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(
    ("tool", "limits", "says"),
    [
        ("slow", {"timeout_s": 0.5}, "The tool slow did not answer within 0.5 s."),
        ("fail", {}, "The tool fail reported an error: Error executing tool fail: the disk is on fire"),
        ("huge", {"max_result_chars": 100}, "The tool huge returned 50000 characters, more than the 100 allowed."),
    ],
)
def test_a_tool_that_hangs_fails_or_floods_is_an_error_the_model_is_told_and_the_answer_goes_on(
    mcp_server, tool, limits, says
):
    bodies: list[dict[str, object]] = []

    async def model_server(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        if len(bodies) == 1:
            return event_stream(call_chunks(tool, "{}"))
        return event_stream(text_chunks("Sorry."))

    runner = McpRunner(ToolServerConfig("tests", mcp_server.url, **limits))
    with ScriptedServer(model_server) as upstream:
        events = run_with_tools(upstream, runner)

    result = next(e.data for e in events if e.type == "tool_result")
    assert result["status"] == "error"
    assert result["result"] == says
    assert bodies[1]["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": says}
    assert events[-1].type == "done"


def test_stop_during_a_slow_tool_call_ends_the_answer_as_stopped_without_waiting_for_it(mcp_server):
    async def model_server(request: web.Request) -> web.Response:
        return event_stream(call_chunks("slow", "{}"))

    store = InMemoryStreamStore()
    pool = UpstreamPool(store, health_interval_s=60)
    endpoint = {"model": "remote", "base_url": "", "upstream_model": "m"}
    runner = McpRunner(ToolServerConfig("tests", mcp_server.url, timeout_s=30))
    with ScriptedServer(model_server) as upstream:
        pool.configure([endpoint_from_json({**endpoint, "base_url": upstream.base_url}, "e")])
        body = {"messages": ASK, "tools": [ADD]}
        try:
            pool.submit(Job("s1", ASK), model="remote", prompt_tokens=10, body=body, tools=runner)
            wait_until(lambda: any(e.type == "tool_start" for e in store.events("s1")), timeout=10)
            began = time.monotonic()
            store.cancel("s1")
            events = wait_for_terminal(store, "s1", timeout=10)
            took = time.monotonic() - began
        finally:
            pool.shut_down(1)

    assert events[-1].type == "done"
    assert events[-1].data["finish_reason"] == "cancelled"
    assert took < 2  # not the slow tool's 3 s
    assert not any(e.type == "tool_result" for e in events)


def test_a_runner_that_raises_fails_that_call_only():
    class Broken:
        max_rounds = 4

        async def run(self, call: ToolCall, *, round_number: int, tell: object) -> ToolOutcome:
            raise RuntimeError("bug")

    bodies: list[dict[str, object]] = []

    async def model_server(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        return event_stream(call_chunks("add", "{}") if len(bodies) == 1 else text_chunks("ok"))

    with ScriptedServer(model_server) as upstream:
        events = run_with_tools(upstream, Broken())  # type: ignore[arg-type]

    result = next(e.data for e in events if e.type == "tool_result")
    assert result["status"] == "error"
    assert result["result"] == "The tool 'add' failed."
    assert events[-1].type == "done"


# -- the plain parts -------------------------------------------------------------------


def test_calls_gather_from_deltas_in_index_order_and_get_an_id_when_the_server_gives_none():
    gathered = ToolCallGatherer()
    gathered.add([{"index": 1, "function": {"name": "b", "arguments": "{"}}])
    gathered.add([{"index": 0, "id": "x", "function": {"name": "a", "arguments": "{}"}}])
    gathered.add([{"index": 1, "function": {"arguments": "}"}}])

    assert gathered.calls() == [ToolCall("x", "a", "{}"), ToolCall("call_1_1", "b", "{}")]
    gathered.clear()
    assert gathered.calls() == []
    assert gathered.round == 2


def test_the_round_after_the_last_asks_for_text_and_a_forced_choice_holds_once():
    body = {"messages": ASK, "tools": [ADD], "tool_choice": {"type": "function", "function": {"name": "add"}}}
    added = tool_round_messages("", [ToolCall("c", "add", "{}")], [ToolOutcome(True, "2")])

    assert added[0] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "add", "arguments": "{}"}}],
    }
    assert next_round_body(body, added, last=False)["tool_choice"] == "auto"
    assert next_round_body(body, added, last=True)["tool_choice"] == "none"
    assert "tool_choice" not in next_round_body({"messages": ASK}, added, last=False)
    assert body["messages"] == ASK  # not changed in place


def test_a_calls_events_are_plain_json_for_any_stream_store():
    event = tool_event(ToolCall("c", "add", "{}"), ToolOutcome(False, "no", 0.0123), round_number=2)

    assert json.loads(json.dumps(event)) == event
    assert event == {
        "id": "c",
        "name": "add",
        "arguments": "{}",
        "status": "error",
        "round": 2,
        "result": "no",
        "duration_ms": 12,
    }


def test_an_endpoints_slot_is_given_back_while_a_tool_runs():
    release = threading.Event()

    class Waiting:
        """A call that lasts until the test lets it end (as one waiting for Approve would)."""

        max_rounds = 4

        async def run(self, call: ToolCall, *, round_number: int, tell: object) -> ToolOutcome:
            while not release.is_set():
                await asyncio.sleep(0.02)
            return ToolOutcome(True, "2")

    async def model_server(request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("tools") and body["messages"][-1]["role"] != "tool":
            return event_stream(call_chunks("add", "{}"))
        return event_stream(text_chunks("Hi."))

    store = InMemoryStreamStore()
    pool = UpstreamPool(store, health_interval_s=60)
    with ScriptedServer(model_server) as upstream:
        endpoint = {"model": "remote", "base_url": upstream.base_url, "upstream_model": "m", "max_concurrent": 1}
        pool.configure([endpoint_from_json(endpoint, "e")])
        try:
            body = {"messages": ASK, "tools": [ADD]}
            pool.submit(Job("s1", ASK), model="remote", prompt_tokens=10, body=body, tools=Waiting())
            wait_until(lambda: any(e.type == "tool_start" for e in store.events("s1")), timeout=10)
            pool.submit(Job("s2", ASK), model="remote", prompt_tokens=10, body={"messages": ASK})
            other = wait_for_terminal(store, "s2", timeout=10)  # while s1's call still runs
            release.set()
            first = wait_for_terminal(store, "s1", timeout=10)
        finally:
            release.set()
            pool.shut_down(1)

    assert other[-1].type == "done"
    assert [e.type for e in first][-3:] == ["tool_result", "token", "done"]
