from __future__ import annotations

from django import template
from django.utils.safestring import SafeString

from generation.rendering import render_markdown

register = template.Library()


@register.filter(name="markdown")
def markdown(text: str) -> SafeString:
    """Render a model's answer as sanitised Markdown."""
    return render_markdown(text)
