from __future__ import annotations

from typing import Any

from django import template

from documents.selectors import documents_panel_context

register = template.Library()


@register.inclusion_tag("documents/_documents.html", takes_context=True)
def documents_panel(context: template.Context, conversation: Any) -> dict[str, Any]:
    """The documents panel of a saved conversation, as the page and the upload responses show it."""
    panel = documents_panel_context(user=context["request"].user, conversation_id=conversation.id)
    return {**panel, "csrf_token": context.get("csrf_token"), "request": context["request"]}
