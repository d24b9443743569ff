"""The MCP client of the tool servers against a real one (tests/support/mcp_server.py):
each way a call can go wrong ends that call with an error text, never an exception."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from tests.support.livesite import free_port
from tests.support.mcp_server import HUGE_CHARS, MCPToolServer
from tools.mcp_client import ToolServerConfig, ToolServerError, tool_call, tools_list


@pytest.fixture(scope="module")
def mcp_server() -> Iterator[MCPToolServer]:
    with MCPToolServer() as server:
        yield server


def config(server: MCPToolServer, **settings: object) -> ToolServerConfig:
    return ToolServerConfig(name="tests", url=server.url, **settings)  # type: ignore[arg-type]


def test_a_server_lists_its_tools_with_their_argument_schemas(mcp_server):
    specs = {spec.name: spec for spec in asyncio.run(tools_list(config(mcp_server)))}

    assert {"add", "slow", "fail", "huge", "html"} <= specs.keys()
    assert specs["add"].description == "Add two integers."
    assert set(specs["add"].input_schema["properties"]) == {"a", "b"}
    assert specs["add"].as_openai()["function"]["parameters"] == specs["add"].input_schema


def test_a_quick_tool_answers_with_its_text(mcp_server):
    outcome = asyncio.run(tool_call(config(mcp_server), "add", '{"a": 2, "b": 40}'))

    assert outcome.ok
    assert outcome.text == "42"
    assert 0 < outcome.duration_s < 10


def test_a_tool_slower_than_the_timeout_ends_with_an_error_in_time(mcp_server):
    began = time.monotonic()
    outcome = asyncio.run(tool_call(config(mcp_server, timeout_s=0.5), "slow", "{}"))
    took = time.monotonic() - began

    assert not outcome.ok
    assert outcome.text == "The tool slow did not answer within 0.5 s."
    assert took < 2.5  # not the tool's 3 s


def test_a_tool_that_fails_tells_its_error(mcp_server):
    outcome = asyncio.run(tool_call(config(mcp_server), "fail", "{}"))

    assert not outcome.ok
    assert "the disk is on fire" in outcome.text


def test_a_result_over_the_size_cap_is_an_error_not_the_result(mcp_server):
    outcome = asyncio.run(tool_call(config(mcp_server, max_result_chars=1000), "huge", "{}"))

    assert not outcome.ok
    assert outcome.text == f"The tool huge returned {HUGE_CHARS} characters, more than the 1000 allowed."


def test_arguments_that_are_not_a_json_object_are_refused_before_the_server_is_asked(mcp_server):
    assert asyncio.run(tool_call(config(mcp_server), "add", "{not json")).text.startswith(
        "The arguments for add are not JSON"
    )
    assert not asyncio.run(tool_call(config(mcp_server), "add", "[1, 2]")).ok


def test_an_unknown_tool_is_an_error_outcome(mcp_server):
    outcome = asyncio.run(tool_call(config(mcp_server), "nope", "{}"))

    assert not outcome.ok
    assert "nope" in outcome.text


def test_a_server_that_is_not_there_is_an_error_outcome_and_cannot_be_listed():
    gone = ToolServerConfig(name="gone", url=f"http://127.0.0.1:{free_port()}/mcp", timeout_s=5)

    outcome = asyncio.run(tool_call(gone, "add", "{}"))
    assert not outcome.ok
    assert outcome.text.startswith("The tool add failed:")
    with pytest.raises(ToolServerError, match="gone could not be listed"):
        asyncio.run(tools_list(gone))


def test_the_servers_headers_go_with_every_request(mcp_server):
    before = len(mcp_server.headers_seen)
    asyncio.run(tool_call(config(mcp_server, headers={"Authorization": "Bearer s3cret"}), "add", '{"a":1,"b":1}'))

    sent = mcp_server.headers_seen[before:]
    assert sent
    assert all(headers.get("authorization") == "Bearer s3cret" for headers in sent)
