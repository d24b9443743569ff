"""The tool loop with real parts on both sides: llama.cpp's server on the packaged GGUF as
the model (a forced tool_choice makes even this small model call the tool) and an MCP
tool server from the `mcp` SDK, joined by the model-server pool."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from inference.engine import Job
from inference.streams import InMemoryStreamStore
from inference.tool_loop import ToolCall, ToolOutcome
from inference.upstream import UpstreamPool, endpoint_from_json
from tests.support.engines import wait_for_terminal
from tests.support.mcp_server import MCPToolServer
from tests.support.upstreams import LlamaCppServer
from tools.mcp_client import ToolServerConfig, tool_call, tools_list


@dataclass
class McpRunner:
    server: ToolServerConfig
    max_rounds: int = 1
    calls: list[ToolCall] = field(default_factory=list)

    async def run(self, call: ToolCall, *, round_number: int, tell: object) -> ToolOutcome:
        self.calls.append(call)
        return await tool_call(self.server, call.name, call.arguments)


def test_llama_cpp_calls_an_mcp_tool_and_answers_with_its_result():
    with MCPToolServer() as mcp_server, LlamaCppServer() as llama:
        config = ToolServerConfig("tests", mcp_server.url)
        weather = next(spec for spec in asyncio.run(tools_list(config)) if spec.name == "weather")
        store = InMemoryStreamStore()
        pool = UpstreamPool(store, health_interval_s=60)
        pool.configure([endpoint_from_json(llama.endpoint(), "llama")])
        runner = McpRunner(config)
        ask = [{"role": "user", "content": "What is the weather in Paris?"}]
        body = {
            "messages": ask,
            "tools": [weather.as_openai()],
            "tool_choice": {"type": "function", "function": {"name": "weather"}},
            "max_tokens": 40,
            "temperature": 0,
        }
        try:
            pool.submit(Job("s1", ask), model="smol-tools", prompt_tokens=20, body=body, tools=runner)
            events = wait_for_terminal(store, "s1", timeout=240)
        finally:
            pool.shut_down(5)

    kinds = [event.type for event in events]
    assert kinds[:2] == ["tool_start", "tool_result"], llama.log()[-2000:]
    result = events[1].data
    assert result["name"] == "weather"
    assert result["status"] == "ok"
    assert result["result"].startswith("Sunny, 21 C in ")
    assert len(runner.calls) == 1  # one round allowed: the model was then asked for text
    assert kinds[-1] == "done"
    assert events[-1].data["status"] == "complete"
    assert "token" in kinds  # it went on after the result, in text
