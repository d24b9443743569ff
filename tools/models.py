"""Tool servers (MCP, streamable HTTP), the tools each conversation lets its model call, and
each call an answer made.

The chat's models live in the generation app, above this one: they are named as strings,
never imported."""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models

from accounts.models import Plan
from tools.mcp_client import ToolServerConfig


class ToolServer(models.Model):
    """An MCP server whose tools chat answers may call (README: Tools)."""

    name = models.CharField(max_length=100, unique=True, help_text="Shown to users next to its tools.")
    url = models.URLField("URL", max_length=500, help_text="Its streamable-HTTP endpoint, e.g. http://host:8000/mcp.")
    # Sent with every request to the server (an Authorization header, say): written in the
    # admin, never shown again.
    headers = models.JSONField(default=dict, blank=True)
    allowed_plans = models.ManyToManyField(
        Plan, blank=True, related_name="tool_servers", help_text="The plans whose users may use it. None: every plan."
    )
    timeout_s = models.FloatField(
        "timeout (s)", default=30.0, validators=[MinValueValidator(0.1)], help_text="How long one call may take."
    )
    max_result_chars = models.PositiveIntegerField(
        "result-size cap",
        default=20_000,
        validators=[MinValueValidator(1)],
        help_text="Characters of a result; a longer one is an error the model is told.",
    )
    enabled = models.BooleanField(default=True)
    # Written from CHAT_TOOL_SERVERS (tools.services.tool_servers_sync), which owns it: the
    # admin shows it read-only, and it is disabled once the environment no longer names it.
    from_environment = models.BooleanField(default=False, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def config(self) -> ToolServerConfig:
        return ToolServerConfig(
            name=self.name,
            url=self.url,
            headers={str(k): str(v) for k, v in self.headers.items()},
            timeout_s=self.timeout_s,
            max_result_chars=self.max_result_chars,
        )


class ConversationTool(models.Model):
    """A tool a conversation lets its model call (the conversation's settings), and whether
    each call waits for its owner's Approve."""

    class Approval(models.TextChoices):
        ALWAYS = "always", "Always allow"
        ASK = "ask", "Ask every time"

    conversation = models.ForeignKey("generation.Conversation", on_delete=models.CASCADE, related_name="tools")
    server = models.ForeignKey(ToolServer, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=200)
    approval = models.CharField(max_length=10, choices=Approval.choices, default=Approval.ALWAYS)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["conversation", "server", "name"], name="conversation_tool_once")
        ]

    def __str__(self) -> str:
        return f"{self.server.name}: {self.name}"


class ToolCallRecord(models.Model):
    """One tool call of an answer, as its block shows it: saved by the producer before the
    call's `tool_result` event, so that a reader who sees the event finds the row."""

    class Status(models.TextChoices):
        OK = "ok"
        ERROR = "error"

    message = models.ForeignKey("generation.Message", on_delete=models.CASCADE, related_name="tool_calls")
    call_id = models.CharField(max_length=200)
    round = models.PositiveSmallIntegerField(default=1)
    server = models.CharField(max_length=100, blank=True)
    name = models.CharField(max_length=200)
    arguments = models.TextField(blank=True)
    status = models.CharField(max_length=10, choices=Status.choices)
    result = models.TextField(blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["message", "id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"
