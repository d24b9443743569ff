"""The conversation settings' tool list, wherever the settings panel is rendered."""

from __future__ import annotations

from typing import Any

from django import template

from generation.models import Conversation
from generation.tool_views import chat_tools_context

register = template.Library()


@register.inclusion_tag("tools/_conversation_tools.html")
def chat_tools(conversation: Conversation) -> dict[str, Any]:
    return chat_tools_context(conversation)
