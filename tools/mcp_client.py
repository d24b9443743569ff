"""Talking to MCP tool servers over streamable HTTP, with the official `mcp` SDK: listing a
server's tools, and calling one. Plain Python, no Django (import-linter checks it).

A call never raises for the tool's sake: a server that hangs past the timeout, refuses,
errors, or answers with more than the size cap gives an error outcome whose text the model
is told, so that one bad tool ends that call, never the answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from inference.tool_loop import ToolOutcome

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolServerConfig:
    """What a call needs to know of its server (tools.models.ToolServer.config())."""

    name: str
    url: str
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # secrets: never shown
    timeout_s: float = 30.0
    max_result_chars: int = 20_000


@dataclass(frozen=True)
class ToolSpec:
    """One tool a server offers, as listed: its name, description and JSON Schema of arguments."""

    name: str
    description: str
    input_schema: dict[str, Any]

    def as_openai(self) -> dict[str, Any]:
        """The tool as a chat request's `tools` entry."""
        function = {"name": self.name, "description": self.description, "parameters": self.input_schema}
        return {"type": "function", "function": function}

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ToolSpec:
        return cls(data["name"], data.get("description") or "", data.get("input_schema") or {"type": "object"})


@dataclass(frozen=True)
class ConfiguredToolServer:
    """A tool server of CHAT_TOOL_SERVERS: its config, and the names of the plans whose users
    may use it (none: every plan)."""

    config: ToolServerConfig
    plans: tuple[str, ...] = ()


_CONFIGURED_FIELDS = {"name", "url", "headers", "plans", "timeout_s", "max_result_chars"}


def tool_server_from_json(data: Any) -> ConfiguredToolServer:
    """A tool server from a JSON object (CHAT_TOOL_SERVERS); ValueError naming what is wrong."""
    if not isinstance(data, dict):
        raise ValueError("each tool server is a JSON object")
    if missing := {"name", "url"} - data.keys():
        raise ValueError(f"a tool server needs {', '.join(sorted(missing))}")
    if unknown := data.keys() - _CONFIGURED_FIELDS:
        raise ValueError(f"unknown tool server fields: {', '.join(sorted(unknown))}")
    name, url = data["name"], data["url"]
    if not isinstance(name, str) or not name.strip() or len(name) > 100:
        raise ValueError(f"name must be text of 1 to 100 characters, not {name!r}")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"{name}: url must be an http(s) URL, not {url!r}")
    headers, plans = data.get("headers", {}), data.get("plans", [])
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise ValueError(f"{name}: headers must be an object of text values")
    if not isinstance(plans, list) or not all(isinstance(plan, str) for plan in plans):
        raise ValueError(f"{name}: plans must be a list of plan names")
    timeout_s, max_chars = data.get("timeout_s", 30.0), data.get("max_result_chars", 20_000)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s < 0.1:
        raise ValueError(f"{name}: timeout_s must be a number of at least 0.1, not {timeout_s!r}")
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1:
        raise ValueError(f"{name}: max_result_chars must be a whole number of at least 1, not {max_chars!r}")
    config = ToolServerConfig(name.strip(), url, dict(headers), float(timeout_s), max_chars)
    return ConfiguredToolServer(config, tuple(plans))


def tool_servers_from_json(entries: list[Any]) -> list[ConfiguredToolServer]:
    """CHAT_TOOL_SERVERS's servers; ValueError naming what is wrong (a name given twice, too)."""
    servers = [tool_server_from_json(entry) for entry in entries]
    names = [server.config.name for server in servers]
    if twice := sorted({name for name in names if names.count(name) > 1}):
        raise ValueError(f"tool server names must differ: {', '.join(twice)} given twice")
    return servers


class ToolServerError(Exception):
    """A tool server could not be listed: unreachable, refusing, or too slow."""


@asynccontextmanager
async def _connected(server: ToolServerConfig) -> AsyncIterator[Client]:
    """A session with the server; its HTTP client carries the server's headers."""
    timeout = httpx2.Timeout(server.timeout_s)
    async with (
        httpx2.AsyncClient(headers=server.headers, timeout=timeout) as http,
        Client(streamable_http_client(server.url, http_client=http), cache=None) as client,
    ):
        yield client


async def tools_list(server: ToolServerConfig) -> list[ToolSpec]:
    """The server's tools, every page of them; ToolServerError when it cannot be listed."""
    try:
        async with asyncio.timeout(server.timeout_s), _connected(server) as client:
            specs, cursor = [], None
            while True:
                page = await client.list_tools(cursor=cursor)
                specs += [ToolSpec(t.name, t.description or "", dict(t.input_schema)) for t in page.tools]
                cursor = page.next_cursor
                if not cursor:
                    return specs
    except TimeoutError:
        raise ToolServerError(f"{server.name} did not list its tools within {server.timeout_s:g} s.") from None
    except Exception as error:
        raise ToolServerError(f"{server.name} could not be listed: {_reason(error)}") from None


async def tool_call(server: ToolServerConfig, name: str, arguments: str) -> ToolOutcome:
    """Call the tool `name` with `arguments` (the model's JSON text): its result as text, or
    an error outcome (bad arguments, timeout, server error, the tool's own error, a result
    over the size cap)."""
    began = time.monotonic()

    def outcome(ok: bool, text: str) -> ToolOutcome:
        return ToolOutcome(ok=ok, text=text, duration_s=time.monotonic() - began)

    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return outcome(False, f"The arguments for {name} are not JSON: {arguments[:200]}")
    if not isinstance(parsed, dict):
        return outcome(False, f"The arguments for {name} must be a JSON object.")
    try:
        async with asyncio.timeout(server.timeout_s), _connected(server) as client:
            result = await client.call_tool(name, parsed)
    except TimeoutError:
        return outcome(False, f"The tool {name} did not answer within {server.timeout_s:g} s.")
    except Exception as error:  # unreachable, refused, a protocol error: told, never raised
        logger.warning("Tool call %s on %s failed: %s", name, server.name, _reason(error))
        return outcome(False, f"The tool {name} failed: {_reason(error)}")
    text = result_text(result.content, result.structured_content)
    if len(text) > server.max_result_chars:
        return outcome(
            False,
            f"The tool {name} returned {len(text)} characters, more than the {server.max_result_chars} allowed.",
        )
    if result.is_error:
        return outcome(False, f"The tool {name} reported an error: {text}")
    return outcome(True, text)


def result_text(content: list[Any], structured: Any = None) -> str:
    """A result's content as text for the model: text blocks as they are, others named."""
    parts = []
    for block in content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and hasattr(block.resource, "text"):
            parts.append(block.resource.text)
        else:
            parts.append(f"[{kind or 'content'} omitted]")
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    return "\n".join(parts)


def _reason(error: BaseException) -> str:
    """An error's words; an exception group (anyio's task groups raise them) by its first."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return str(error) or type(error).__name__
