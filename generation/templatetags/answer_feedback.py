"""The rating controls under an answer, and the admin's satisfaction figure, wherever they are shown."""

from __future__ import annotations

from typing import Any

from django import template

from generation.feedback import SATISFACTION_DAYS, satisfaction_by_model
from generation.forms import FeedbackForm
from generation.models import Message

register = template.Library()


@register.inclusion_tag("generation/_feedback.html")
def feedback_controls(message: Message) -> dict[str, Any]:
    """👍 / 👎 and the reason and comment, as saved, for a finished answer."""
    return {"message": message, "form": FeedbackForm(answer=message)}


@register.inclusion_tag("admin/generation/feedback/_satisfaction.html")
def satisfaction_table() -> dict[str, Any]:
    """Per model, the share of rated answers rated good (the usage admin shows it by its chart)."""
    return {"rows": satisfaction_by_model(), "days": SATISFACTION_DAYS}
