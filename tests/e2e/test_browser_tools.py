"""Tools in a real Chromium: a conversation on a model server's model switches a tool of a
real MCP tool server on, set to "Ask every time"; an answer's call waits with Approve and
Deny, runs once approved (or is not made once denied), and shows its result as text, once:
streamed, after a reload mid-call, and after the answer is saved."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from aiohttp import web
from playwright.sync_api import expect

from tests.support.browser import sign_up
from tests.support.livesite import LiveSite, manage
from tests.support.mcp_server import MCPToolServer
from tests.support.upstreams import ScriptedServer, event_stream

CREATE_TOOL_SERVER = "from tools.models import ToolServer; ToolServer.objects.create(name='local', url={url!r})"


async def model_server(request: web.Request) -> web.Response:
    """Calls the `html` tool when offered tools (and not answering its result yet), else answers."""
    body = await request.json()
    if body.get("tools") and body["messages"][-1]["role"] != "tool":
        call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "html", "arguments": "{}"}}
        return event_stream(
            [{"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": "tool_calls"}]}]
        )
    text = "Done." if body["messages"][-1]["role"] == "tool" else "Hello."
    return event_stream([{"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}]}])


@pytest.fixture(scope="module")
def tools_site(live_sites) -> Iterator[LiveSite]:
    with MCPToolServer() as mcp_server, ScriptedServer(model_server) as upstream:
        endpoints = [{"model": "remote", "base_url": upstream.base_url, "upstream_model": "m"}]
        env = {"CHAT_ENABLE_SYNTHETIC": "1", "CHAT_MODEL": "synthetic", "CHAT_UPSTREAMS": json.dumps(endpoints)}
        with live_sites.own(env) as site:
            manage(site.root, site.env, "shell", "-c", CREATE_TOOL_SERVER.format(url=mcp_server.url))
            yield site


@pytest.fixture
def page(browser, tools_site):
    context = browser.new_context(base_url=tools_site.base_url)
    page = context.new_page()
    yield page
    context.close()


def test_a_tool_call_waits_for_approve_or_deny_and_shows_its_result_as_text_once(page):
    sign_up(page, "ui-tools")
    page.locator("summary", has_text="Settings").click()
    page.get_by_label("Model").select_option("remote")
    page.get_by_label("Message").fill("Hello")
    page.get_by_role("button", name="Send").click()
    expect(page).to_have_url(re.compile(r"/chat/[0-9a-f-]{36}/$"))
    expect(page.locator("article[data-role=assistant]").last).to_have_attribute("data-status", "complete")

    page.reload()
    page.locator("#settings summary").click()
    tools = page.locator("#conversation-tools")
    tools.locator("[name=tools][value$=':html']").check()
    tools.locator("[name=ask][value$=':html']").check()
    tools.get_by_role("button", name="Save tools").click()
    expect(page.locator("#conversation-tools [role=status]")).to_have_text(
        "Saved. The next answer may call these tools."
    )

    page.get_by_label("Message").fill("Show me some HTML")
    page.get_by_role("button", name="Send").click()
    answer = page.locator("article[data-role=assistant]").last
    block = answer.locator("[data-tool-call=call_1]")
    expect(block.locator("[data-tool-status]")).to_have_text("Waiting for your approval")
    block.get_by_role("button", name="Approve").click()

    expect(answer).to_have_attribute("data-status", "complete")
    block = answer.locator("[data-tool-call=call_1]")
    expect(block).to_have_count(1)
    expect(block.locator("[data-tool-status]")).to_have_text("Ok")
    expect(block.locator("[data-tool-result]")).to_have_text("<script>alert(1)</script><b>bold</b>")
    expect(answer.locator(".message-body")).to_have_text("Done.")

    page.reload()
    answer = page.locator("article[data-role=assistant]").last
    expect(answer.locator("[data-tool-call]")).to_have_count(1)
    expect(answer.locator("[data-tool-result]")).to_have_text("<script>alert(1)</script><b>bold</b>")
    expect(answer.locator("b")).to_have_count(0)  # the result's HTML was never parsed

    # Another answer's call, reloaded while it waits: still one block, then denied.
    page.get_by_label("Message").fill("Once more")
    page.get_by_role("button", name="Send").click()
    answer = page.locator("article[data-role=assistant]").last
    expect(answer.locator("[data-tool-status]")).to_have_text("Waiting for your approval")
    page.reload()
    answer = page.locator("article[data-role=assistant]").last
    expect(answer.locator("[data-tool-call]")).to_have_count(1)
    answer.get_by_role("button", name="Deny").click()
    expect(answer).to_have_attribute("data-status", "complete")
    expect(answer.locator("[data-tool-call]")).to_have_count(1)
    expect(answer.locator("[data-tool-status]")).to_have_text("Error")
    expect(answer.locator("[data-tool-result]")).to_have_text("The user denied this call; it was not made.")
