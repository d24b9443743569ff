"""Writes and side effects of the chat: conversations, messages, starting generations."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable
from functools import partial, wraps
from typing import Any

from django.contrib.auth.models import User
from django.db import close_old_connections, transaction

from generation import runtime
from generation.engine import EngineOverloaded, GenerationResult, Job
from generation.generators import GenerationParams
from generation.models import Conversation, Message
from generation.streams import StreamNotFound

logger = logging.getLogger(__name__)

TITLE_LENGTH = 60
# An answer is included in the model's context only if it has text worth continuing from.
_CONTEXT_STATUSES = (Message.Status.COMPLETE, Message.Status.STOPPED, Message.Status.INTERRUPTED)


def conversation_create(*, user: User, model: str | None = None) -> Conversation:
    return Conversation.objects.create(user=user, model=model or runtime.model_names()[0])


def _engine_thread_task(function: Callable[..., None]) -> Callable[..., None]:
    """Run a write from the engine thread on a fresh connection, closed afterwards.

    The engine thread lives as long as the process; without this it would hold a
    database connection open between generations.
    """

    @wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        close_old_connections()
        try:
            function(*args, **kwargs)
        finally:
            close_old_connections()

    return wrapper


def message_send(*, conversation: Conversation, prompt: str) -> tuple[Message, Message]:
    """Save the prompt and a streaming answer, and queue the answer's generation.

    Raises EngineOverloaded after marking the answer as an error when the queue is full:
    the prompt is kept either way.
    """
    engine = runtime.engine(conversation.model)
    history = _chat_history(conversation)
    with transaction.atomic():
        prompt_message = conversation.messages.create(role=Message.Role.USER, content=prompt)
        answer = conversation.messages.create(
            role=Message.Role.ASSISTANT,
            status=Message.Status.STREAMING,
            stream_id=uuid.uuid4().hex,
            model=conversation.model,
            producer=engine.producer,
        )
        if not conversation.title:
            conversation.title = " ".join(prompt.split())[:TITLE_LENGTH]
        conversation.save(update_fields=["title", "updated_at"])
    assert answer.stream_id is not None
    job = Job(
        stream_id=answer.stream_id,
        messages=[*history, {"role": "user", "content": prompt}],
        params=GenerationParams(max_tokens=conversation.max_tokens, temperature=conversation.temperature),
        on_progress=_engine_thread_task(partial(message_save_progress, answer.pk)),
        on_finish=_engine_thread_task(partial(message_finish, answer.pk)),
    )
    try:
        engine.submit(job)
    except EngineOverloaded:
        message_finish(
            answer.pk,
            GenerationResult(
                text="", status="error", finish_reason="error", error="The server is busy. Try again in a moment."
            ),
        )
        answer.refresh_from_db()
        raise
    return prompt_message, answer


def message_save_progress(message_id: int, text: str) -> None:
    """Save the text so far of a streaming answer ."""
    Message.objects.filter(pk=message_id, status=Message.Status.STREAMING).update(content=text)


def message_finish(message_id: int, result: GenerationResult) -> None:
    """Save a finished answer with its usage and timings ."""
    Message.objects.filter(pk=message_id).update(
        content=result.text,
        status=result.status,
        finish_reason=result.finish_reason,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        ttft_ms=None if result.ttft_s is None else round(result.ttft_s * 1000),
        duration_ms=round(result.duration_s * 1000),
        error=result.error,
    )


def message_stop(*, message: Message) -> bool:
    """Ask the producer of a streaming answer to stop; it saves what it generated."""
    if not message.streaming or not message.stream_id:
        return False
    return runtime.stream_store().cancel(message.stream_id)


def message_mark_interrupted(message: Message) -> Message:
    """Settle an answer whose producer is gone: keep its text, mark it interrupted.

    Its stream, if still there, ends with an error event so that readers stop waiting.
    """
    settled = Message.objects.filter(pk=message.pk, status=Message.Status.STREAMING).update(
        status=Message.Status.INTERRUPTED, error="The server stopped while this answer was being written."
    )
    if settled and message.stream_id:
        with contextlib.suppress(StreamNotFound, ValueError):  # gone, or ended meanwhile
            runtime.stream_store().append(
                message.stream_id, "error", {"message": "interrupted", "status": Message.Status.INTERRUPTED}
            )
    message.refresh_from_db()
    return message


def messages_settle_orphans() -> int:
    """Mark interrupted the streaming answers of producers that no longer beat."""
    store = runtime.stream_store()
    settled = 0
    for message in Message.objects.filter(status=Message.Status.STREAMING).exclude(producer=runtime.PRODUCER):
        if not store.producer_alive(message.producer):
            message_mark_interrupted(message)
            settled += 1
    return settled


def _chat_history(conversation: Conversation) -> list[dict[str, str]]:
    history = [{"role": "system", "content": conversation.system_prompt}] if conversation.system_prompt else []
    for role, content, status in conversation.messages.values_list("role", "content", "status"):
        if role == Message.Role.USER or (status in _CONTEXT_STATUSES and content):
            history.append({"role": role, "content": content})
    return history
