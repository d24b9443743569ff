"""What a conversation is made of, read one way everywhere: each prompt with its newest answer.

Regenerate and Edit keep earlier answers in the database; the page shows, and the model
is given, only the newest answer to each prompt. This module is the one place that says so.
"""

from __future__ import annotations

from generation.models import Conversation, Message

# An answer is included in the model's context only if it has text worth continuing from.
CONTEXT_STATUSES = (Message.Status.COMPLETE, Message.Status.STOPPED, Message.Status.INTERRUPTED)


def thread(conversation: Conversation) -> list[Message]:
    """The conversation's messages in order, each prompt followed by its newest answer only."""
    if conversation._state.adding:  # not saved yet: no messages
        return []
    shown: list[Message] = []
    for message in conversation.messages.all():
        if message.role == Message.Role.ASSISTANT and shown and shown[-1].role == Message.Role.ASSISTANT:
            shown[-1] = message  # a newer answer to the same prompt
        else:
            shown.append(message)
    return shown


def last_exchange(conversation: Conversation) -> tuple[Message | None, Message | None]:
    """The conversation's last prompt and its newest answer (None where there is none)."""
    shown = thread(conversation)
    prompts = [index for index, message in enumerate(shown) if message.role == Message.Role.USER]
    if not prompts:
        return None, None
    last = prompts[-1]
    return shown[last], shown[last + 1] if last + 1 < len(shown) else None


def chat_history(conversation: Conversation, *, through: Message | None = None) -> list[dict[str, str]]:
    """The conversation as the model sees it: its system prompt, then each prompt with its
    newest answer where that has text to continue from; nothing after `through`, if given."""
    history = [{"role": "system", "content": conversation.system_prompt}] if conversation.system_prompt else []
    for message in thread(conversation):
        if message.role == Message.Role.USER:
            history.append({"role": "user", "content": message.content})
            if through is not None and message.pk == through.pk:
                break
        elif message.status in CONTEXT_STATUSES and message.content:
            history.append({"role": "assistant", "content": message.content})
    return history
