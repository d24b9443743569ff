"""What a conversation is made of, read one way everywhere: a tree of versions, one branch shown.

Every message has a parent (the message it follows); messages with the same parent are
versions of one another: Regenerate adds a version of an answer, Edit a version of a
prompt (with its own answers below it). The conversation's current leaf picks the branch:
the page shows, and the model is given, the path from the first message to that leaf.
This module is the one place that says so.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    """A conversation's messages, loaded in one query, with their versions and branches."""

    def __init__(self, conversation: Conversation) -> None:
        self.conversation = conversation
        # Not saved yet (a new chat): no messages.
        self.messages = [] if conversation._state.adding else list(conversation.messages.all())
        self._by_id = {message.pk: message for message in self.messages}
        self._order = {message.pk: index for index, message in enumerate(self.messages)}
        self._children: dict[int | None, list[Message]] = {}
        for message in self.messages:  # in order of creation: versions oldest first
            self._children.setdefault(message.parent_id, []).append(message)

    def leaf(self) -> Message | None:
        """The last message of the chosen branch; the newest message until one is chosen."""
        chosen = self._by_id.get(self.conversation.current_leaf_id)  # type: ignore[arg-type]
        return chosen or (self.messages[-1] if self.messages else None)

    def path(self, last: Message | None) -> list[Message]:
        """The messages from the first one down to `last`, in order ([] for None)."""
        path: list[Message] = []
        current = self._by_id.get(last.pk) if last is not None else None
        while current is not None and current not in path:  # `in`: never loop on bad data
            path.append(current)
            current = self._by_id.get(current.parent_id)  # type: ignore[arg-type]
        return path[::-1]

    def thread(self) -> list[Message]:
        """The chosen branch: what the page shows and the model continues from."""
        return self.path(self.leaf())

    def newest_leaf(self, message: Message) -> Message:
        """The newest message at or below `message`: choosing a version shows its newest branch."""
        newest, below = message, [message]
        while below:
            current = below.pop()
            newest = max(newest, current, key=lambda candidate: self._order[candidate.pk])
            below.extend(self._children.get(current.pk, []))
        return newest

    def versions(self, message: Message) -> Versions:
        siblings = self._children.get(message.parent_id, [message])
        index = siblings.index(message) if message in siblings else 0
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
