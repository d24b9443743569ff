"""Tool calls on the ledger: the pool counts the calls an answer ran, its usage record
keeps the count as it settles, and the admin's usage list shows it. And the usage a model
server reports over a tool loop's rounds: its cached prompt tokens, added up."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from django.urls import reverse
from django.utils import timezone

from accounts.models import UsageRecord
from accounts.services import account_for, api_key_create, usage_admit, usage_finish
from inference.engine import GenerationResult, Job
from inference.streams import InMemoryStreamStore
from inference.upstream import UpstreamPool, endpoint_from_json
from tests.support.api_client import get
from tests.support.engines import wait_for_terminal, wait_until
from tests.support.mcp_server import MCPToolServer
from tests.support.upstreams import ScriptedServer, event_stream
from tests.tools.test_tool_loop import ADD, ASK, McpRunner, call_chunks, text_chunks
from tools.mcp_client import ToolServerConfig


@pytest.fixture(scope="module")
def mcp_server() -> Iterator[MCPToolServer]:
    with MCPToolServer() as server:
        yield server


def finished(model_server, body: dict[str, Any], runner: McpRunner | None = None) -> GenerationResult:
    """The result a pool hands its job's on_finish for one answer of `model_server`."""
    results: list[GenerationResult] = []
    store = InMemoryStreamStore()
    pool = UpstreamPool(store, health_interval_s=60)
    with ScriptedServer(model_server) as upstream:
        endpoint = {"model": "remote", "base_url": upstream.base_url, "upstream_model": "m"}
        pool.configure([endpoint_from_json(endpoint, "e")])
        try:
            job = Job("s1", ASK, on_finish=results.append)
            pool.submit(job, model="remote", prompt_tokens=10, body=body, tools=runner)
            wait_for_terminal(store, "s1", timeout=30)
            wait_until(lambda: bool(results), timeout=5)
        finally:
            pool.shut_down(1)
    return results[0]


def test_the_pool_reports_every_tool_call_an_answer_ran(mcp_server):
    async def model_server(request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("tool_choice") == "none":
            return event_stream(text_chunks("Done."))
        return event_stream(call_chunks("add", '{"a": 1, "b": 1}'))

    runner = McpRunner(ToolServerConfig("tests", mcp_server.url), max_rounds=2)
    result = finished(model_server, {"messages": ASK, "tools": [ADD], "max_tokens": 200}, runner)

    assert len(runner.calls) == 2
    assert result.tool_calls == 2


def test_an_answer_whose_client_runs_the_tools_reports_none_run():
    async def model_server(request: web.Request) -> web.Response:
        return event_stream(call_chunks("add", '{"a": 1, "b": 1}'))  # streamed to the client, not run

    result = finished(model_server, {"messages": ASK, "tools": [ADD]})

    assert result.tool_calls == 0


def admitted(user) -> str:
    stream_id = uuid.uuid4().hex
    usage_admit(
        user=user,
        limits=account_for(user).limits,
        requests=1,
        channel="ui",
        model="remote",
        stream_id=stream_id,
        producer="test",
        prompt_tokens=10,
        max_tokens=50,
    )
    return stream_id


@pytest.mark.django_db
def test_a_settled_record_keeps_its_answers_tool_calls_and_the_admin_lists_them(alice, admin_client):
    stream_id = admitted(alice)
    assert UsageRecord.objects.get(stream_id=stream_id).tool_calls == 0

    usage_finish(
        stream_id=stream_id,
        status="complete",
        finish_reason="stop",
        prompt_tokens=30,
        completion_tokens=7,
        ttft_ms=5,
        duration_ms=9,
        tool_calls=3,
    )

    assert UsageRecord.objects.get(stream_id=stream_id).tool_calls == 3
    listing = admin_client.get(reverse("admin:accounts_usagerecord_changelist")).content.decode()
    assert "column-tool_calls" in listing
    assert '<td class="field-tool_calls">3</td>' in listing


@pytest.mark.django_db(transaction=True)  # the API's view reads on a database thread of its own
def test_v1_usage_counts_the_callers_tool_calls_of_today_only(alice, bob):
    for user, calls in ((alice, 3), (alice, 2), (bob, 7)):
        usage_finish(
            stream_id=admitted(user),
            status="complete",
            finish_reason="stop",
            prompt_tokens=30,
            completion_tokens=7,
            ttft_ms=5,
            duration_ms=9,
            tool_calls=calls,
        )
    yesterday = timezone.now() - dt.timedelta(days=1)
    UsageRecord.objects.filter(user=alice, tool_calls=2).update(created_at=yesterday)
    key = api_key_create(user=alice, name="usage")[1]

    assert get("/v1/usage", key).json()["tool_calls_today"] == 3


def test_the_cached_tokens_a_model_server_reports_are_passed_on_and_added_up_over_tool_rounds(mcp_server):
    def usage(cached: object) -> dict[str, object]:
        details = {"prompt_tokens_details": {"cached_tokens": cached}}
        return {"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42, **details}}

    async def model_server(request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("tool_choice") == "none":  # the second round: its prompt begins as the first's did
            return event_stream([*text_chunks("Done."), usage(30)])
        return event_stream([*call_chunks("add", '{"a": 1, "b": 1}'), usage(8)])

    runner = McpRunner(ToolServerConfig("tests", mcp_server.url), max_rounds=1)
    result = finished(model_server, {"messages": ASK, "tools": [ADD], "max_tokens": 200}, runner)
    assert (result.prompt_tokens, result.cached_tokens) == (80, 38)
    assert result.summary()["usage"]["prompt_tokens_details"] == {"cached_tokens": 38}


@pytest.mark.parametrize(
    "details", ["12", None, {"cached_tokens": "12"}, {"cached_tokens": -3}, {"cached_tokens": 2.5}, {}]
)
def test_a_model_servers_malformed_cached_tokens_count_as_none(details):
    async def model_server(request: web.Request) -> web.Response:
        usage = {"prompt_tokens": 40, "completion_tokens": 1, "total_tokens": 41, "prompt_tokens_details": details}
        return event_stream([*text_chunks("Hi."), {"choices": [], "usage": usage}])

    result = finished(model_server, {"messages": ASK})
    assert (result.prompt_tokens, result.cached_tokens) == (40, 0)
    assert "prompt_tokens_details" not in result.summary()["usage"]
