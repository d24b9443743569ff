"""Share links: a read-only copy of a conversation's branch shown, at /s/<token>/.

The snapshot copies the messages (with their sources' names and excerpts, never the
files), so later edits, regenerations and deletions of messages leave it as it was;
"Update link" copies the branch again under the same token. Deleting the conversation
deletes its link. CHAT_SHARING says who may open links: nobody (`off`), anyone logged in
(`users`) or anyone with the link (`public`).
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.db import transaction

from generation.models import Conversation, Message, SharedLink
from generation.selectors import MessageTree

# 32 URL-safe characters: 192 random bits, beyond guessing.
TOKEN_BYTES = 24
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_-]{32}")


class SharingOff(Exception):
    """CHAT_SHARING=off: no link is made or opened."""


def sharing_enabled() -> bool:
    return settings.CHAT_SHARING != "off"


def share_panel_context(conversation: Conversation, link: SharedLink | None = None) -> dict[str, Any]:
    """What the conversation's Share panel (generation/_share.html) shows."""
    return {
        "sharing_enabled": sharing_enabled(),
        "sharing_public": settings.CHAT_SHARING == "public",
        "shared_link": link or SharedLink.objects.filter(conversation=conversation).first(),
    }


def _snapshot(conversation: Conversation) -> list[dict[str, Any]]:
    """The branch shown, as the shared page shows it. An answer still streaming is left
    out: its text is not final."""
    return [
        {
            "role": message.role,
            "content": message.content,
            "model": message.model,
            "status": message.status,
            "sources": [
                {
                    "number": source.get("number"),
                    "document": source.get("document", ""),
                    "excerpt": source.get("excerpt", ""),
                }
                for source in message.sources
            ],
        }
        for message in MessageTree(conversation).thread()
        if not message.streaming
    ]


def shared_link_publish(*, conversation: Conversation, update: bool = False) -> SharedLink:
    """The conversation's link, made with a snapshot of its branch shown if it has none;
    `update` takes a new snapshot under the same token."""
    if not sharing_enabled():
        raise SharingOff
    with transaction.atomic():
        link = SharedLink.objects.select_for_update().filter(conversation=conversation).first()
        if link is not None and not update:
            return link
        if link is None:
            link = SharedLink(conversation=conversation, token=secrets.token_urlsafe(TOKEN_BYTES))
        link.title = conversation.title
        link.messages = _snapshot(conversation)
        link.save()
    return link


def shared_links_of(user: User) -> list[SharedLink]:
    return list(SharedLink.objects.filter(conversation__user=user).select_related("conversation"))


def shared_link_revoke(*, link: SharedLink) -> None:
    """Delete the link: its address answers 404 from now on."""
    link.delete()


def login_needed(viewer: User | AnonymousUser) -> bool:
    """Whether the viewer must log in before a link opens (CHAT_SHARING=users)."""
    return settings.CHAT_SHARING == "users" and not viewer.is_authenticated


def shared_link_open(*, token: str, viewer: User | AnonymousUser) -> SharedLink | None:
    """The link a token names, if the viewer may open it (the owner always may, while
    sharing is on); None otherwise, said as 404 so that a link's existence is not revealed."""
    if not sharing_enabled() or not TOKEN_PATTERN.fullmatch(token) or login_needed(viewer):
        return None
    return SharedLink.objects.select_related("conversation").filter(token=token).first()


@transaction.atomic
def shared_link_continue(*, link: SharedLink, user: User, models: list[str], max_tokens: int) -> Conversation:
    """The snapshot as a new conversation of `user`, to continue from its last message.

    The original's model if this site serves it, else the default (`models[0]`); its
    system prompt and settings are the owner's and stay with them, but for max_tokens
    capped by `user`'s plan.
    """
    model = link.conversation.model if link.conversation.model in models else models[0]
    conversation = Conversation(user=user, title=link.title, model=model)
    conversation.max_tokens = min(conversation.max_tokens, max_tokens)
    conversation.save()
    parent: Message | None = None
    for item in link.messages:
        parent = Message(
            conversation=conversation,
            parent=parent,
            role=item["role"],
            content=item["content"],
            model=item.get("model", ""),
            status=item.get("status", Message.Status.COMPLETE),
            sources=item.get("sources", []),
        )
        parent.save(root=True)
    Conversation.objects.filter(pk=conversation.pk).update(current_leaf=parent)
    conversation.refresh_from_db()
    return conversation
