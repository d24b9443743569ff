"""Tools in the chat: tool servers in the admin, the conversation's tool list, and an answer
that calls a real MCP tool server through a (scripted) model server, its calls saved with it
and shown once, as text."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from aiohttp import web
from django.urls import reverse

from accounts.models import UsageRecord
from generation.backends import router, runtime
from generation.models import Conversation, Message
from generation.transfer import (
    conversation_document,
    conversation_document_parse,
    conversation_import,
    conversation_markdown,
)
from generation.views import answer_events
from inference.tool_loop import ToolCall
from tests.support.engines import wait_until
from tests.support.mcp_server import MCPToolServer
from tests.support.upstreams import ScriptedServer, event_stream
from tools.models import ConversationTool, ToolCallRecord, ToolServer
from tools.services import ChatToolRunner, tool_server_tools


@pytest.fixture(scope="module")
def mcp_server() -> Iterator[MCPToolServer]:
    with MCPToolServer() as server:
        yield server


def call_chunks(name: str) -> list[dict[str, object]]:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": name, "arguments": "{}"}}
    return [{"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": "tool_calls"}]}]


class ModelServer:
    """A model server that calls the `html` tool when offered tools, then answers."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, object]] = []
        self.server = ScriptedServer(self.answer)

    async def answer(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        if body.get("tools") and body["messages"][-1]["role"] != "tool":
            return event_stream(call_chunks("html"))
        text = {"choices": [{"index": 0, "delta": {"content": "Here it is."}, "finish_reason": "stop"}]}
        return event_stream([text])


@pytest.fixture
def remote(settings, fast_engine) -> Iterator[ModelServer]:
    """A model server's model, `remote`, next to the in-process synthetic one."""
    model_server = ModelServer()
    with model_server.server as upstream:
        settings.CHAT_UPSTREAMS = [{"model": "remote", "base_url": upstream.base_url, "upstream_model": "m"}]
        yield model_server
        router.backend().upstream.pool.shut_down(1)


@pytest.fixture
def tool_server(mcp_server) -> ToolServer:
    return ToolServer.objects.create(name="local", url=mcp_server.url, timeout_s=10)


def tools_url(conversation: Conversation) -> str:
    return reverse("generation:conversation_tools", args=[conversation.id])


@pytest.mark.django_db(transaction=True)  # the model-server pool saves on threads of its own
def test_an_answer_calls_the_tools_switched_on_and_shows_each_call_once_as_text(
    alice, alice_client, remote, tool_server
):
    conversation = Conversation.objects.create(user=alice, model="remote")
    switched = alice_client.post(tools_url(conversation), {"tools": [f"{tool_server.pk}:html"]})
    assert switched.status_code == 302
    assert list(ConversationTool.objects.values_list("name", flat=True)) == ["html"]

    alice_client.post(conversation.get_absolute_url(), {"prompt": "Show me some HTML"})
    answer = Message.objects.get(conversation=conversation, role=Message.Role.ASSISTANT)
    wait_until(lambda: Message.objects.get(pk=answer.pk).status != Message.Status.STREAMING, timeout=20)
    answer.refresh_from_db()

    assert answer.status == Message.Status.COMPLETE
    assert answer.content == "Here it is."
    record = ToolCallRecord.objects.get(message=answer)
    assert (record.name, record.server, record.status) == ("html", "local", "ok")
    # The ledger counts the call on the answer's usage record.
    wait_until(lambda: UsageRecord.objects.get(stream_id=answer.stream_id).status != "streaming", timeout=10)
    assert UsageRecord.objects.get(stream_id=answer.stream_id).tool_calls == 1
    assert record.result == "<script>alert(1)</script><b>bold</b>"
    # The model was offered the tool, and told its result.
    first, second = remote.bodies[0], remote.bodies[1]
    assert [tool["function"]["name"] for tool in first["tools"]] == ["html"]
    assert second["messages"][-1]["content"] == record.result

    page = alice_client.get(conversation.get_absolute_url()).content.decode()
    assert page.count('data-tool-call="call_1"') == 1
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;b&gt;bold&lt;/b&gt;" in page
    assert "<script>alert(1)" not in page
    # Its stream, read again from the start (a reload), tells the call once, before the text.
    replay = answer_events(runtime.stream_store().events(answer.stream_id)).decode()
    assert replay.count("event: tool_start") == 1
    assert replay.count("event: tool_result") == 1
    assert replay.index("event: tool_result") < replay.index("event: token")
    assert '"status":"ok","round":1,"result":"<script>alert(1)</script><b>bold</b>"' in replay


@pytest.mark.django_db(transaction=True)
def test_a_conversation_without_tools_switched_on_offers_the_model_none(alice, alice_client, remote, tool_server):
    conversation = Conversation.objects.create(user=alice, model="remote")

    alice_client.post(conversation.get_absolute_url(), {"prompt": "Hello"})
    wait_until(lambda: not Message.objects.filter(conversation=conversation, status="streaming").exists(), timeout=20)

    assert "tools" not in remote.bodies[0]
    assert not ToolCallRecord.objects.exists()


@pytest.mark.django_db
def test_an_in_process_model_cannot_call_tools_and_the_settings_say_why(alice, alice_client, fast_engine, tool_server):
    conversation = Conversation.objects.create(user=alice, model="synthetic")
    page = alice_client.get(conversation.get_absolute_url()).content.decode()

    assert "synthetic runs on this site&#x27;s own engine, which cannot call tools." in page
    assert "<fieldset disabled>" in page
    assert f'value="{tool_server.pk}:add"' in page


@pytest.mark.django_db
def test_bob_cannot_switch_tools_on_in_alices_conversation(alice, bob_client, fast_engine, tool_server):
    conversation = Conversation.objects.create(user=alice, model="synthetic")

    response = bob_client.post(tools_url(conversation), {"tools": [f"{tool_server.pk}:add"]})

    assert response.status_code == 404
    assert not ConversationTool.objects.exists()


@pytest.mark.django_db
def test_a_tool_not_offered_to_the_user_cannot_be_switched_on(alice, alice_client, fast_engine, tool_server):
    other_plan_only = ToolServer.objects.create(name="private", url=tool_server.url)
    other_plan_only.allowed_plans.create(name="gold")
    conversation = Conversation.objects.create(user=alice, model="synthetic")

    response = alice_client.post(
        tools_url(conversation), {"tools": [f"{other_plan_only.pk}:add"]}, HTTP_HX_REQUEST="true"
    )

    assert response.status_code == 422
    assert not ConversationTool.objects.exists()


@pytest.mark.django_db
def test_a_servers_tool_list_is_kept_until_refreshed(tool_server, mcp_server):
    listed = tool_server_tools(server=tool_server)
    tool_server.url = "http://127.0.0.1:9/mcp"  # unsaved: same cache key, so the kept list answers

    assert tool_server_tools(server=tool_server) == listed
    with pytest.raises(Exception, match="could not be listed"):
        tool_server_tools(server=tool_server, refresh=True)


@pytest.mark.django_db
def test_a_tool_servers_headers_are_written_in_the_admin_and_never_shown_again(admin_client, mcp_server):
    server = ToolServer.objects.create(name="local", url=mcp_server.url, headers={"Authorization": "Bearer s3cret"})
    url = reverse("admin:tools_toolserver_change", args=[server.pk])

    page = admin_client.get(url).content.decode()
    assert "s3cret" not in page
    assert "Authorization" in page  # its name only

    form = {"name": "local", "url": mcp_server.url, "timeout_s": 5, "max_result_chars": 100, "enabled": "on"}
    assert admin_client.post(url, {**form, "new_headers": ""}).status_code == 302
    server.refresh_from_db()
    assert server.headers == {"Authorization": "Bearer s3cret"}  # blank keeps them
    assert server.timeout_s == 5
    admin_client.post(url, {**form, "new_headers": "X-Key: abc"})
    server.refresh_from_db()
    assert server.headers == {"X-Key": "abc"}
    admin_client.post(url, {**form, "clear_headers": "on"})
    server.refresh_from_db()
    assert server.headers == {}
    assert admin_client.post(url, {**form, "new_headers": "no colon here"}).status_code == 200  # refused


@pytest.mark.django_db(transaction=True)  # the runner saves on a database thread
def test_a_call_stopped_midway_is_saved_as_stopped_and_the_stop_goes_on(alice, tool_server):
    conversation = Conversation.objects.create(user=alice, model="remote")
    answer = conversation.messages.create(role=Message.Role.ASSISTANT, status=Message.Status.STREAMING)
    runner = ChatToolRunner({"slow": tool_server.config()}, answer.pk, max_rounds=4)

    async def stop_midway() -> None:
        task = asyncio.ensure_future(runner.run(ToolCall("c1", "slow", "{}"), round_number=1, tell=lambda status: None))
        await asyncio.sleep(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(stop_midway())

    record = ToolCallRecord.objects.get(message=answer)
    assert (record.call_id, record.status, record.result) == ("c1", "error", "Stopped before the tool answered.")


@pytest.mark.django_db(transaction=True)
def test_a_call_of_a_tool_no_server_offers_is_an_error_told_to_the_model(alice, tool_server):
    conversation = Conversation.objects.create(user=alice, model="remote")
    answer = conversation.messages.create(role=Message.Role.ASSISTANT, status=Message.Status.STREAMING)
    runner = ChatToolRunner({"add": tool_server.config()}, answer.pk, max_rounds=4)

    outcome = asyncio.run(runner.run(ToolCall("c1", "rm_rf", "{}"), round_number=2, tell=lambda status: None))

    assert not outcome.ok
    assert outcome.text == "There is no tool named 'rm_rf'."
    assert ToolCallRecord.objects.get(message=answer).round == 2


def decision_url(answer: Message) -> str:
    return reverse("generation:tool_call_decision", args=[answer.pk])


def ask_before_html(client, conversation: Conversation, server: ToolServer) -> None:
    key = f"{server.pk}:html"
    assert client.post(tools_url(conversation), {"tools": [key], "ask": [key]}).status_code == 302


def waiting_answer(client, conversation: Conversation) -> Message:
    """Send a prompt; the answer once its tool call waits for approval."""
    client.post(conversation.get_absolute_url(), {"prompt": "Show me some HTML"})
    answer = Message.objects.get(conversation=conversation, role=Message.Role.ASSISTANT)
    store = runtime.stream_store()
    wait_until(
        lambda: any(e.type == "tool_start" and e.data["status"] == "waiting" for e in store.events(answer.stream_id)),
        timeout=20,
    )
    return answer


def finished(answer: Message) -> Message:
    wait_until(lambda: Message.objects.get(pk=answer.pk).status != Message.Status.STREAMING, timeout=20)
    answer.refresh_from_db()
    return answer


@pytest.mark.django_db(transaction=True)
def test_a_call_set_to_ask_waits_for_approve_then_runs(alice, alice_client, bob_client, remote, tool_server):
    conversation = Conversation.objects.create(user=alice, model="remote")
    ask_before_html(alice_client, conversation, tool_server)
    answer = waiting_answer(alice_client, conversation)

    assert bob_client.post(decision_url(answer), {"call_id": "call_1", "decision": "approve"}).status_code == 404
    assert not ToolCallRecord.objects.exists()  # still waiting: bob's click did nothing
    assert alice_client.post(decision_url(answer), {"call_id": "call_1", "decision": "approve"}).status_code == 204
    answer = finished(answer)

    record = ToolCallRecord.objects.get(message=answer)
    assert (record.status, record.result) == ("ok", "<script>alert(1)</script><b>bold</b>")
    statuses = [e.data["status"] for e in runtime.stream_store().events(answer.stream_id) if e.type == "tool_start"]
    assert statuses[-2:] == ["waiting", "running"]
    assert answer.status == Message.Status.COMPLETE


@pytest.mark.django_db(transaction=True)
def test_a_denied_call_is_not_made_and_the_model_is_told(alice, alice_client, remote, tool_server, mcp_server):
    conversation = Conversation.objects.create(user=alice, model="remote")
    ask_before_html(alice_client, conversation, tool_server)
    answer = waiting_answer(alice_client, conversation)
    calls_before = len(mcp_server.headers_seen)

    alice_client.post(decision_url(answer), {"call_id": "call_1", "decision": "deny"})
    answer = finished(answer)

    record = ToolCallRecord.objects.get(message=answer)
    assert (record.status, record.result) == ("error", "The user denied this call; it was not made.")
    assert remote.bodies[-1]["messages"][-1]["content"] == record.result
    assert len(mcp_server.headers_seen) == calls_before  # the tool server was never asked
    assert answer.content == "Here it is."


@pytest.mark.django_db(transaction=True)
def test_a_call_nobody_approves_in_time_is_not_made(alice, tool_server):
    conversation = Conversation.objects.create(user=alice, model="remote")
    answer = conversation.messages.create(role=Message.Role.ASSISTANT, status=Message.Status.STREAMING)
    told: list[str] = []
    runner = ChatToolRunner(
        {"add": tool_server.config()}, answer.pk, max_rounds=4, ask=frozenset({"add"}), approval_timeout_s=0.5
    )

    outcome = asyncio.run(runner.run(ToolCall("c1", "add", '{"a": 1, "b": 2}'), round_number=1, tell=told.append))

    assert told == ["waiting"]
    assert not outcome.ok
    assert outcome.text == "The user did not approve this call in time; it was not made."


@pytest.mark.django_db
def test_a_decision_needs_a_call_and_approve_or_deny(alice, alice_client):
    conversation = Conversation.objects.create(user=alice, model="remote")
    answer = conversation.messages.create(role=Message.Role.ASSISTANT, status=Message.Status.STREAMING)

    assert alice_client.post(decision_url(answer), {"call_id": "c1", "decision": "maybe"}).status_code == 400
    assert alice_client.post(decision_url(answer), {"decision": "approve"}).status_code == 400


@pytest.mark.django_db
def test_an_answers_tool_calls_go_out_with_its_export_and_come_back_with_its_import(alice, alice_client, fast_engine):
    conversation = Conversation.objects.create(user=alice, model="synthetic", title="Weather")
    prompt = conversation.messages.create(role=Message.Role.USER, content="Weather?")
    answer = conversation.messages.create(role=Message.Role.ASSISTANT, content="Sunny.", parent=prompt)
    ToolCallRecord.objects.create(
        message=answer,
        call_id="c1",
        name="weather",
        server="local",
        arguments='{"city": "Paris"}',
        status="ok",
        result="Sunny, 21 C",
        duration_ms=12,
    )

    document = conversation_document(conversation)
    assert document["messages"][1]["tool_calls"] == [
        {
            "id": "c1",
            "name": "weather",
            "server": "local",
            "round": 1,
            "arguments": '{"city": "Paris"}',
            "status": "ok",
            "result": "Sunny, 21 C",
            "duration_ms": 12,
        },
    ]
    assert '- weather `{"city": "Paris"}` → ok: Sunny, 21 C' in conversation_markdown(conversation)

    parsed = conversation_document_parse(json.dumps(document).encode())
    copy = conversation_import(user=alice, document=parsed, models=["synthetic"], max_tokens=512)
    restored = ToolCallRecord.objects.get(message__conversation=copy)
    assert (restored.call_id, restored.name, restored.result) == ("c1", "weather", "Sunny, 21 C")
    assert restored.duration_ms == 12
