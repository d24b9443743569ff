"""A real MCP tool server (the `mcp` SDK's MCPServer, formerly FastMCP, over streamable
HTTP) in a thread of the test process, on a free loopback port, serving quick tools (add,
weather, html), one slow (past a short timeout), one that fails, one whose result is huge."""

from __future__ import annotations

import asyncio
import threading
import time

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from starlette.types import ASGIApp, Receive, Scope, Send

from tests.support.livesite import free_port

SLOW_S = 3.0  # the slow tool's answer time: longer than the timeouts the tests give it
HUGE_CHARS = 50_000


def tool_server() -> MCPServer:
    server = MCPServer("chatsite-tests")

    @server.tool(description="Add two integers.")
    def add(a: int, b: int) -> str:
        return str(a + b)

    @server.tool(description="The weather in a city.")
    def weather(city: str) -> str:
        return f"Sunny, 21 C in {city}"

    @server.tool(description="Answer after a while.")
    async def slow(text: str = "done") -> str:
        await asyncio.sleep(SLOW_S)
        return text

    @server.tool(description="Always fails.")
    def fail() -> str:
        raise ToolError("the disk is on fire")

    @server.tool(description="Return far too much text.")
    def huge() -> str:
        return "x" * HUGE_CHARS

    @server.tool(description="Return some HTML, which must be shown as text.")
    def html() -> str:
        return "<script>alert(1)</script><b>bold</b>"

    return server


class _RecordHeaders:
    """ASGI middleware that keeps each request's headers, for tests of what is sent."""

    def __init__(self, app: ASGIApp, seen: list[dict[str, str]]) -> None:
        self.app, self.seen = app, seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.seen.append({k.decode().lower(): v.decode() for k, v in scope["headers"]})
        await self.app(scope, receive, send)


class MCPToolServer:
    """`with MCPToolServer() as server:` serves tool_server() at `server.url` until the block ends."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.headers_seen: list[dict[str, str]] = []
        app = _RecordHeaders(tool_server().streamable_http_app(), self.headers_seen)
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="mcp-tool-server", daemon=True)

    def __enter__(self) -> MCPToolServer:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the MCP tool server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
