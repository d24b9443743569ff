"""Tool servers configured in the environment (CHAT_TOOL_SERVERS): checked at start-up,
written into the admin's rows on first use, offered like the admin's, and owned by the
environment."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.urls import reverse

from accounts.models import Plan
from accounts.services import account_for
from generation.checks import settings_check_or_stop
from generation.models import Conversation
from tests.support.mcp_server import MCPToolServer
from tools import services
from tools.mcp_client import tool_servers_from_json
from tools.models import ConversationTool, ToolServer
from tools.services import tool_servers_for, tool_servers_sync


@pytest.fixture(scope="module")
def mcp_server() -> Iterator[MCPToolServer]:
    with MCPToolServer() as server:
        yield server


@pytest.fixture(autouse=True)
def fresh_sync(monkeypatch) -> None:
    """Each test's database starts empty: its process has synced nothing yet."""
    monkeypatch.setattr(services, "_synced", None)


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (["http://x/mcp"], "each tool server is a JSON object"),
        ([{"url": "http://x/mcp"}], "a tool server needs name"),
        ([{"name": "a", "url": "ftp://x"}], "a: url must be an http(s) URL"),
        ([{"name": "a", "url": "http://x", "header": {}}], "unknown tool server fields: header"),
        ([{"name": "a", "url": "http://x", "headers": {"X": 1}}], "a: headers must be an object of text values"),
        ([{"name": "a", "url": "http://x", "plans": "pro"}], "a: plans must be a list of plan names"),
        ([{"name": "a", "url": "http://x", "timeout_s": 0}], "a: timeout_s must be a number of at least 0.1"),
        ([{"name": "a", "url": "http://x", "max_result_chars": 1.5}], "a: max_result_chars must be a whole number"),
        ([{"name": "a", "url": "http://x"}, {"name": "a", "url": "http://y"}], "a given twice"),
    ],
)
def test_each_bad_tool_server_entry_is_refused_naming_what_is_wrong(entries, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        tool_servers_from_json(entries)


def test_a_bad_tool_servers_value_stops_start_up_naming_the_variable(settings):
    settings.CHAT_TOOL_SERVERS = [{"url": "http://x/mcp"}]

    with pytest.raises(ImproperlyConfigured, match="CHAT_TOOL_SERVERS: a tool server needs name"):
        settings_check_or_stop()


def test_a_good_tool_servers_value_passes_the_start_up_check(settings):
    settings.CHAT_TOOL_SERVERS = [{"name": "search", "url": "https://tools.example/mcp", "timeout_s": 5}]

    settings_check_or_stop()


@pytest.mark.django_db
def test_the_environments_servers_are_offered_to_the_plans_they_name(settings, alice, bob):
    gold = Plan.objects.create(name="gold")
    account = account_for(bob)
    account.plan = gold
    account.save()
    settings.CHAT_TOOL_SERVERS = [
        {"name": "everyone", "url": "http://a/mcp", "headers": {"Authorization": "Bearer k"}},
        {"name": "gold-only", "url": "http://b/mcp", "plans": ["gold"], "timeout_s": 3, "max_result_chars": 99},
    ]

    assert [server.name for server in tool_servers_for(user=alice)] == ["everyone"]
    assert [server.name for server in tool_servers_for(user=bob)] == ["everyone", "gold-only"]
    gold_only = ToolServer.objects.get(name="gold-only")
    assert gold_only.from_environment
    assert (gold_only.timeout_s, gold_only.max_result_chars) == (3.0, 99)
    assert ToolServer.objects.get(name="everyone").config().headers == {"Authorization": "Bearer k"}


@pytest.mark.django_db
def test_an_unchanged_environment_leaves_its_rows_unsaved(settings):
    settings.CHAT_TOOL_SERVERS = [{"name": "search", "url": "http://a/mcp"}]
    tool_servers_sync()
    saved_at = ToolServer.objects.get().updated_at

    tool_servers_sync()

    # Its tool list, cached by the row's time, is not asked for afresh.
    assert ToolServer.objects.get().updated_at == saved_at


@pytest.mark.django_db
def test_a_server_dropped_from_the_environment_is_disabled_and_its_tool_choices_kept(settings, alice):
    settings.CHAT_TOOL_SERVERS = [{"name": "search", "url": "http://a/mcp"}]
    tool_servers_sync()
    server = ToolServer.objects.get()
    conversation = Conversation.objects.create(user=alice, model="remote")
    ConversationTool.objects.create(conversation=conversation, server=server, name="find")
    admins = ToolServer.objects.create(name="admins", url="http://c/mcp")

    settings.CHAT_TOOL_SERVERS = []
    assert tool_servers_for(user=alice) == [admins]

    server.refresh_from_db()
    assert not server.enabled
    assert ConversationTool.objects.filter(server=server).exists()


@pytest.mark.django_db
def test_the_environment_takes_over_an_admin_server_of_the_same_name(settings):
    ToolServer.objects.create(name="search", url="http://old/mcp", enabled=False)
    settings.CHAT_TOOL_SERVERS = [{"name": "search", "url": "http://new/mcp"}]

    tool_servers_sync()

    server = ToolServer.objects.get()
    assert (server.url, server.enabled, server.from_environment) == ("http://new/mcp", True, True)


@pytest.mark.django_db
def test_a_plan_name_no_plan_has_fails_loudly(settings, alice):
    settings.CHAT_TOOL_SERVERS = [{"name": "search", "url": "http://a/mcp", "plans": ["platinum"]}]

    with pytest.raises(ImproperlyConfigured, match="CHAT_TOOL_SERVERS: no plan is named platinum"):
        tool_servers_for(user=alice)


@pytest.mark.django_db
def test_an_environment_servers_tools_are_listed_in_the_conversation_settings(
    settings, alice, alice_client, mcp_server
):
    settings.CHAT_TOOL_SERVERS = [{"name": "local", "url": mcp_server.url, "timeout_s": 10}]
    conversation = Conversation.objects.create(user=alice, model="synthetic")

    page = alice_client.get(conversation.get_absolute_url()).content.decode()

    server = ToolServer.objects.get(name="local")
    assert f'value="{server.pk}:add"' in page


@pytest.mark.django_db
def test_the_admin_shows_an_environment_server_but_cannot_change_or_delete_it(settings, admin_client):
    settings.CHAT_TOOL_SERVERS = [{"name": "search", "url": "http://a/mcp"}]
    tool_servers_sync()
    server = ToolServer.objects.get()
    change_url = reverse("admin:tools_toolserver_change", args=[server.pk])

    assert admin_client.get(change_url).status_code == 200
    form = {"name": "hijacked", "url": "http://evil/mcp", "timeout_s": 5, "max_result_chars": 100}
    assert admin_client.post(change_url, form).status_code == 403
    assert (
        admin_client.post(reverse("admin:tools_toolserver_delete", args=[server.pk]), {"post": "yes"}).status_code
        == 403
    )
    assert ToolServer.objects.get().name == "search"
