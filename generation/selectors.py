"""What a conversation is made of, read one way everywhere: a tree of versions, one branch shown.

Every message has a parent (the message it follows); messages with the same parent are
versions of one another: Regenerate adds a version of an answer, Edit a version of a
prompt (with its own answers below it). The conversation's current leaf picks the branch:
the page shows, and the model is given, the path from the first message to that leaf.
This module is the one place that says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.db.models import OuterRef, QuerySet, Subquery

from accounts.models import UsageRecord
from accounts.prices import spend_of
from generation.models import Conversation, Message

# An answer is included in the model's context only if it has text worth continuing from.
CONTEXT_STATUSES = (Message.Status.COMPLETE, Message.Status.STOPPED, Message.Status.INTERRUPTED)


@dataclass(frozen=True)
class Versions:
    """Where a message stands among its versions: "◀ position/count ▶"."""

    position: int
    count: int
    previous: Message | None
    next: Message | None


class MessageTree:
    """A conversation's messages, loaded in one query, with their versions and branches.

    Every walk is linear in the messages: an imported conversation may have thousands, and
    a walk that compared each message with those before it took seconds a page.
    """

    def __init__(self, conversation: Conversation, *, costs: bool = False) -> None:
        self.conversation = conversation
        # Not saved yet (a new chat): no messages.
        # Each answer's rating and tool calls with it: the page shows them under every
        # answer; and, for the page, its cost (`costs`).
        messages = conversation.messages.select_related("feedback").prefetch_related("tool_calls")
        self.messages = [] if conversation._state.adding else list(with_costs(messages) if costs else messages)
        self._by_id = {message.pk: message for message in self.messages}
        self._order = {message.pk: index for index, message in enumerate(self.messages)}
        self._children: dict[int | None, list[Message]] = {}
        self._position: dict[int, int] = {}  # each message's index among its versions
        for message in self.messages:  # in order of creation: versions oldest first
            versions = self._children.setdefault(message.parent_id, [])
            self._position[message.pk] = len(versions)
            versions.append(message)

    def leaf(self) -> Message | None:
        """The last message of the chosen branch; the newest message until one is chosen."""
        chosen = self._by_id.get(self.conversation.current_leaf_id)  # type: ignore[arg-type]
        return chosen or (self.messages[-1] if self.messages else None)

    def path(self, last: Message | None) -> list[Message]:
        """The messages from the first one down to `last`, in order ([] for None)."""
        path: list[Message] = []
        seen: set[int] = set()  # never loop on bad data
        current = self._by_id.get(last.pk) if last is not None else None
        while current is not None and current.pk not in seen:
            seen.add(current.pk)
            path.append(current)
            current = self._by_id.get(current.parent_id)  # type: ignore[arg-type]
        return path[::-1]

    def thread(self) -> list[Message]:
        """The chosen branch: what the page shows and the model continues from."""
        return self.path(self.leaf())

    def newest_leaf(self, message: Message) -> Message:
        """The newest message at or below `message`: choosing a version shows its newest branch."""
        newest, below, seen = message, [message], {message.pk}
        while below:
            current = below.pop()
            if self._order.get(current.pk, -1) > self._order.get(newest.pk, -1):
                newest = current
            for child in self._children.get(current.pk, []):
                if child.pk not in seen:  # never loop on bad data
                    seen.add(child.pk)
                    below.append(child)
        return newest

    def versions(self, message: Message) -> Versions:
        siblings = self._children.get(message.parent_id, [message])
        index = self._position.get(message.pk, 0)
        if index >= len(siblings) or siblings[index].pk != message.pk:
            index = 0  # not among them (saved after the tree was read)
        return Versions(
            position=index + 1,
            count=len(siblings),
            previous=siblings[index - 1] if index > 0 else None,
            next=siblings[index + 1] if index + 1 < len(siblings) else None,
        )

    def children(self, message: Message | None) -> list[Message]:
        return self._children.get(message.pk if message is not None else None, [])


def thread(conversation: Conversation) -> list[Message]:
    """The messages of the chosen branch, in order."""
    return MessageTree(conversation).thread()


def chat_history(conversation: Conversation, path: list[Message]) -> list[dict[str, str]]:
    """`path` as the model sees it: the conversation's system prompt, then each prompt and
    each answer that has text to continue from."""
    history = [{"role": "system", "content": conversation.system_prompt}] if conversation.system_prompt else []
    for message in path:
        if message.role == Message.Role.USER:
            history.append({"role": "user", "content": message.content})
        elif message.status in CONTEXT_STATUSES and message.content:
            history.append({"role": "assistant", "content": message.content})
    return history


def with_costs(messages: QuerySet[Message]) -> QuerySet[Message]:
    """The messages, each with `cost` and `cost_currency`: those of its usage record (None
    for a prompt, an answer still streaming, or one whose model had no price)."""
    record = UsageRecord.objects.filter(stream_id=OuterRef("stream_id"))
    return messages.annotate(
        cost=Subquery(record.values("cost")[:1]), cost_currency=Subquery(record.values("cost_currency")[:1])
    )


def conversation_spend(conversation: Conversation) -> dict[str, Decimal]:
    """What the conversation's answers have cost so far, every version included, by currency."""
    if conversation._state.adding:
        return {}
    stream_ids = conversation.messages.filter(stream_id__isnull=False).values("stream_id")
    return spend_of(UsageRecord.objects.filter(user_id=conversation.user_id, stream_id__in=stream_ids))
