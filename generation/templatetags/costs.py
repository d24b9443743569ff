"""Costs as people read them, wherever the chat shows one."""

from __future__ import annotations

from decimal import Decimal

from django import template

from accounts.prices import cost_shown

register = template.Library()


@register.filter
def cost(amount: Decimal | None) -> str:
    """A cost without the trailing zeros of its places: "0.0000123"."""
    return "" if amount is None else cost_shown(amount)
