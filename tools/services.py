"""Tool servers' tools for the chat: which a user may use, which a conversation lets its
model call, the list each server offers (cached, refreshed on demand), and who runs the
calls of an answer (`ChatToolRunner`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib.auth.models import User
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.db.models import Q

from accounts.models import Plan
from accounts.services import account_for
from inference.tool_loop import ToolCall, ToolOutcome, ToolStatus
from infrastructure.database import in_database_thread
from tools.checks import configured_tool_servers
from tools.mcp_client import ToolServerConfig, ToolServerError, ToolSpec, tool_call, tools_list
from tools.models import ConversationTool, ToolCallRecord, ToolServer

# How long a server's tool list is kept before it is asked again (the admin's Refresh asks at once).
TOOL_LIST_TTL_S = 300
TOOL_LIST_FAILURE_TTL_S = 30
# A call that waits for Approve looks for it this often; a decision is kept an hour.
APPROVAL_POLL_S = 0.2
APPROVAL_KEPT_S = 3600


def _list_key(server: ToolServer) -> str:
    # Its settings' time in the key: a server edited in the admin is listed afresh.
    return f"tools:list:{server.pk}:{server.updated_at.timestamp()}"


def tool_server_tools(*, server: ToolServer, refresh: bool = False) -> list[ToolSpec]:
    """The tools `server` offers, from the cache unless `refresh`; ToolServerError when it
    cannot be listed."""
    key = _list_key(server)
    cached = None if refresh else cache.get(key)
    if cached is None:
        try:
            specs = async_to_sync(tools_list)(server.config())
        except ToolServerError as error:
            # Kept a while too: a page that shows the tool list must not wait for a server
            # that is down on every load.
            cache.set(key, {"error": str(error)}, TOOL_LIST_FAILURE_TTL_S)
            raise
        cached = [spec.to_json() for spec in specs]
        cache.set(key, cached, TOOL_LIST_TTL_S)
    if isinstance(cached, dict):
        raise ToolServerError(cached["error"])
    return [ToolSpec.from_json(data) for data in cached]


def tool_servers_sync() -> None:
    """Write CHAT_TOOL_SERVERS's servers into ToolServer rows, marked `from_environment`; an
    environment row the variable no longer names is disabled (not deleted: conversations'
    choices of its tools stay, for when it comes back). A row of the admin's with the same
    name is taken over. An unknown plan name raises ImproperlyConfigured.

    Rows, not servers merged in where they are listed: a conversation's tool choices and
    its calls point at a row, and the admin's tool list and Refresh work on rows, so an
    environment's server is one like any other everywhere. Synced on a process's first
    listing (`tool_servers_for`), not as it imports: no database is touched before one is
    needed, and every kind of process (web, worker, shell) does it the same way. The shape
    of the variable is checked earlier, at start-up (tools/checks.py)."""
    configured = configured_tool_servers()
    plan_names = {name for server in configured for name in server.plans}
    plans = {plan.name: plan for plan in Plan.objects.filter(name__in=plan_names)}
    if unknown := sorted(plan_names - plans.keys()):
        raise ImproperlyConfigured(f"CHAT_TOOL_SERVERS: no plan is named {', '.join(unknown)}.")
    with transaction.atomic():
        for server in configured:
            config = server.config
            fields = {
                "url": config.url,
                "headers": config.headers,
                "timeout_s": config.timeout_s,
                "max_result_chars": config.max_result_chars,
                "enabled": True,
                "from_environment": True,
            }
            # get_or_create: two processes starting together both create it, one row results.
            row, created = ToolServer.objects.get_or_create(name=config.name, defaults=fields)
            # Saved only when changed: saving moves `updated_at`, which lists its tools afresh.
            if not created and any(getattr(row, field) != value for field, value in fields.items()):
                for field, value in fields.items():
                    setattr(row, field, value)
                row.save()
            chosen = {plans[name].pk for name in server.plans}
            if set(row.allowed_plans.values_list("pk", flat=True)) != chosen:
                row.allowed_plans.set(chosen)
        names = [server.config.name for server in configured]
        ToolServer.objects.filter(from_environment=True, enabled=True).exclude(name__in=names).update(enabled=False)


# The CHAT_TOOL_SERVERS value this process has synced (None: none yet).
_synced: list[Any] | None = None


def _synced_once() -> None:
    global _synced
    if _synced != settings.CHAT_TOOL_SERVERS:
        tool_servers_sync()
        _synced = list(settings.CHAT_TOOL_SERVERS)


def tool_servers_for(*, user: User) -> list[ToolServer]:
    """The enabled tool servers that `user`'s plan may use (the environment's among them)."""
    _synced_once()
    plan = account_for(user).plan
    servers = ToolServer.objects.filter(enabled=True).filter(Q(allowed_plans=None) | Q(allowed_plans=plan))
    return list(servers.distinct())


@dataclass(frozen=True)
class OfferedTool:
    """A tool a user may switch on in a conversation."""

    server: ToolServer
    spec: ToolSpec

    @property
    def key(self) -> str:
        """Its choice in a form: the server's id and the tool's name."""
        return f"{self.server.pk}:{self.spec.name}"


def tools_offered(*, user: User) -> tuple[list[OfferedTool], list[str]]:
    """The tools `user` may switch on, and a line for each server that could not be listed."""
    offered, problems = [], []
    for server in tool_servers_for(user=user):
        try:
            offered += [OfferedTool(server, spec) for spec in tool_server_tools(server=server)]
        except ToolServerError as error:
            problems.append(str(error))
    return offered, problems


def conversation_tool_keys(*, conversation: Any, approval: str | None = None) -> set[str]:
    """The tools a conversation lets its model call (those of one `approval` only, if
    given), as OfferedTool keys."""
    rows = conversation.tools.all() if approval is None else conversation.tools.filter(approval=approval)
    return {f"{server_id}:{name}" for server_id, name in rows.values_list("server_id", "name")}


def conversation_tools_set(*, conversation: Any, keys: set[str], ask: set[str], offered: list[OfferedTool]) -> None:
    """Let the conversation's model call exactly the offered tools named by `keys`; those
    also in `ask` wait for their owner's Approve at each call."""
    chosen = [tool for tool in offered if tool.key in keys]
    Approval = ConversationTool.Approval
    with transaction.atomic():
        ConversationTool.objects.filter(conversation=conversation).delete()
        ConversationTool.objects.bulk_create(
            ConversationTool(
                conversation=conversation,
                server=tool.server,
                name=tool.spec.name,
                approval=Approval.ASK if tool.key in ask else Approval.ALWAYS,
            )
            for tool in chosen
        )


@dataclass(frozen=True)
class ChatTools:
    """What an answer may call: the request's `tools` and each tool's server, by its name."""

    specs: list[dict[str, Any]]
    servers: dict[str, ToolServerConfig]
    ask: frozenset[str] = frozenset()  # the names of those whose calls wait for Approve


def chat_tools_for(*, conversation: Any) -> ChatTools | None:
    """The tools a conversation's next answer may call: those switched on, of servers its
    owner may still use, as listed now; None when there are none. A name two servers share
    goes to the first server (by name)."""
    enabled = conversation_tool_keys(conversation=conversation)
    if not enabled:
        return None
    ask = conversation_tool_keys(conversation=conversation, approval=ConversationTool.Approval.ASK)
    asked: set[str] = set()
    specs: list[dict[str, Any]] = []
    servers: dict[str, ToolServerConfig] = {}
    for server in tool_servers_for(user=conversation.user):
        try:
            listed = tool_server_tools(server=server)
        except ToolServerError:
            continue  # its tools are left out of this answer; the settings say why
        for spec in listed:
            key = f"{server.pk}:{spec.name}"
            if key in enabled and spec.name not in servers:
                specs.append(spec.as_openai())
                servers[spec.name] = server.config()
                if key in ask:
                    asked.add(spec.name)
    return ChatTools(specs, servers, frozenset(asked)) if specs else None


# Where an Approve or Deny waits for the call it answers: in the cache, which every web
# process shares where there are several (Redis), so any of them may take the click.
def _decision_key(message_id: int, call_id: str) -> str:
    return f"tools:decision:{message_id}:{call_id}"


def tool_call_decide(*, message_id: int, call_id: str, approved: bool) -> None:
    """The owner's Approve or Deny of a call that waits for it (the caller checked they own it)."""
    cache.set(_decision_key(message_id, call_id), "approve" if approved else "deny", APPROVAL_KEPT_S)


async def _decision(message_id: int, call_id: str, timeout_s: float) -> bool | None:
    """Wait for the owner's decision on a call: True (Approve), False (Deny), None (none in time)."""
    key = _decision_key(message_id, call_id)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        decision = await asyncio.to_thread(cache.get, key)
        if decision is not None:
            return bool(decision == "approve")
        await asyncio.sleep(APPROVAL_POLL_S)
    return None


@dataclass(frozen=True)
class ChatToolRunner:
    """Runs an answer's tool calls on their servers, saving each as its block before the
    stream tells its result (inference.tool_loop.ToolRunner)."""

    servers: dict[str, ToolServerConfig]
    message_id: int
    max_rounds: int
    ask: frozenset[str] = frozenset()
    approval_timeout_s: float = 300.0

    async def run(self, call: ToolCall, *, round_number: int, tell: Callable[[ToolStatus], None]) -> ToolOutcome:
        server = self.servers.get(call.name)
        name = server.name if server else ""
        try:
            outcome = await self._outcome(call, server, tell)
        except asyncio.CancelledError:  # Stop: the answer's block says so, then the answer ends
            stopped = ToolOutcome(ok=False, text="Stopped before the tool answered.")
            await in_database_thread(_record_save, self.message_id, call, stopped, round_number, name)
            raise
        await in_database_thread(_record_save, self.message_id, call, outcome, round_number, name)
        return outcome

    async def _outcome(
        self, call: ToolCall, server: ToolServerConfig | None, tell: Callable[[ToolStatus], None]
    ) -> ToolOutcome:
        if server is None:
            return ToolOutcome(ok=False, text=f"There is no tool named {call.name!r}.")
        if call.name in self.ask:
            tell("waiting")
            approved = await _decision(self.message_id, call.id, self.approval_timeout_s)
            if approved is None:
                return ToolOutcome(ok=False, text="The user did not approve this call in time; it was not made.")
            if not approved:
                return ToolOutcome(ok=False, text="The user denied this call; it was not made.")
            tell("running")
        return await tool_call(server, call.name, call.arguments)


def _record_save(message_id: int, call: ToolCall, outcome: ToolOutcome, round_number: int, server: str) -> None:
    ToolCallRecord.objects.create(
        message_id=message_id,
        call_id=call.id,
        round=round_number,
        server=server,
        name=call.name,
        arguments=call.arguments,
        status=ToolCallRecord.Status.OK if outcome.ok else ToolCallRecord.Status.ERROR,
        result=outcome.text,
        duration_ms=max(0, round(outcome.duration_s * 1000)),
    )


def chat_tool_runner(*, tools: ChatTools, message_id: int) -> ChatToolRunner:
    return ChatToolRunner(
        tools.servers,
        message_id,
        settings.CHAT_TOOL_MAX_ROUNDS,
        ask=tools.ask,
        approval_timeout_s=settings.CHAT_TOOL_APPROVAL_TIMEOUT_S,
    )


# The JSON export's shape of a call (generation/transfer.py), out and back in.
TOOL_CALL_FIELDS = ("name", "server", "round", "arguments", "status", "result", "duration_ms")


def tool_calls_by_message(*, message_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """The tool calls of these messages, in order, by message id, as exported."""
    found: dict[int, list[dict[str, Any]]] = {}
    for record in ToolCallRecord.objects.filter(message_id__in=message_ids).order_by("id"):
        exported = {"id": record.call_id, **{name: getattr(record, name) for name in TOOL_CALL_FIELDS}}
        found.setdefault(record.message_id, []).append(exported)
    return found


def tool_calls_restore(*, message_id: int, calls: list[dict[str, Any]]) -> None:
    """Save an imported message's tool calls (checked by the import's schema)."""
    ToolCallRecord.objects.bulk_create(
        ToolCallRecord(message_id=message_id, call_id=call["id"], **{name: call[name] for name in TOOL_CALL_FIELDS})
        for call in calls
    )
