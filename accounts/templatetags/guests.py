"""`{% guest_keep_invitation %}`: the words of a guest's link to keep the chat."""

from __future__ import annotations

from django import template

from accounts import services

register = template.Library()


@register.simple_tag
def guest_keep_invitation() -> str:
    return services.guest_keep_invitation()
