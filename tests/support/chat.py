"""Conversations answered by the synthetic model, and the engine fixtures their tests share."""

from __future__ import annotations

import pytest

from generation import services
from generation.models import Conversation, Message
from inference.engine import EAGER
from inference.generators import SyntheticGenerator
from infrastructure.database import on_the_callers_thread
from tests.support.engines import install_engine, wait_for_terminal

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def fast_engine(stream_store):
    """The synthetic model at 50 words/s, 12 words an answer.

    Slower than conftest's: an answer must not finish while the view that started it is
    still reading, because the test database (SQLite, shared cache) locks a table for
    the engine thread's write while another connection reads it.
    """
    engine = install_engine(stream_store, SyntheticGenerator(tokens_per_s=50, answer_words=12))
    yield engine
    engine.stop(timeout=10)


@pytest.fixture
def eager_engine(stream_store):
    """The synthetic model, 12 words an answer, run eagerly: each answer is written, saved
    and ended inside the request that starts it, on the test's thread and its database
    connection, so the test's transaction rolls back with it (no `transaction=True`)."""
    engine = install_engine(stream_store, SyntheticGenerator(tokens_per_s=100_000, answer_words=12), scheduler=EAGER)
    with on_the_callers_thread():
        yield engine
    engine.stop(timeout=10)


@pytest.fixture(name="fast_engine")
def fast_engine_run_eagerly(eager_engine):
    """`fast_engine` for a module whose transactions roll back: import this instead."""
    return eager_engine


@pytest.fixture
def seen(fast_engine, monkeypatch) -> list[tuple[list[dict], object]]:
    """What the model was given: (messages, params) for each generation."""
    calls: list[tuple[list[dict], object]] = []
    original = fast_engine.submit

    def submit(job):
        calls.append((job.prompt, job.params))
        return original(job)

    monkeypatch.setattr(fast_engine, "submit", submit)
    return calls


def answered(user, *prompts: str, title: str = "") -> tuple[Conversation, list[Message]]:
    """A conversation of `user` whose prompts were each answered to completion."""
    conversation = services.conversation_create(user=user)
    answers = []
    for prompt in prompts:
        _, answer = services.message_send(conversation=conversation, prompt=prompt)
        wait_for_terminal(_store(), answer.stream_id)
        answer.refresh_from_db()
        answers.append(answer)
    if title:
        Conversation.objects.filter(pk=conversation.pk).update(title=title)
        conversation.refresh_from_db()
    return conversation, answers


def _store():
    from generation.backends import runtime

    return runtime.stream_store()


def newest_answer(conversation: Conversation) -> Message:
    answer = conversation.messages.filter(role=Message.Role.ASSISTANT).last()
    assert answer is not None
    return answer


def settle(answer: Message) -> Message:
    wait_for_terminal(_store(), answer.stream_id)
    answer.refresh_from_db()
    return answer
