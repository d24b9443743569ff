"""A conversation as long as an import allows is read in time linear in its messages.

An imported 5,000-message conversation cost 7-8 s a view while the tree walks compared
each message with every message before it; these bounds are of the linear walk's order
(tens of milliseconds), loose enough for a slow machine, and far below the quadratic one.
Each walk is timed as the fastest of a few runs: a machine busy with other work (CI runs
two test workers on two cores) may stall one run by seconds, seldom all of them, while
a quadratic walk is slow in every one. The comparison counts hold on any machine.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.conf import settings
from django.db.models import Model
from django.urls import reverse

from generation.models import Conversation, Message
from generation.selectors import MessageTree
from generation.transfer import IMPORT_MAX_MESSAGES

pytestmark = pytest.mark.django_db

LONG = IMPORT_MAX_MESSAGES
# Seconds: the linear walks take ~0.05 s; the quadratic ones took several seconds.
WALK_BOUND_S = 1.0
# Seconds for an export of them all (~0.2 s; 7 s and more when quadratic).
VIEW_BOUND_S = 3.0


def chain(user, length: int = LONG) -> Conversation:
    """A conversation of `length` messages, prompt and answer in turn, each following the last."""
    conversation = Conversation.objects.create(user=user, model=settings.CHAT_MODEL, title="Long")
    messages = Message.objects.bulk_create(
        Message(
            conversation=conversation,
            role="user" if index % 2 == 0 else "assistant",
            content=f"message {index}",
        )
        for index in range(length)
    )
    for previous, message in itertools.pairwise(messages):
        message.parent_id = previous.pk
    Message.objects.bulk_update(messages[1:], ["parent"], batch_size=1000)
    return conversation


def versions_of_one_prompt(user, count: int = LONG) -> Conversation:
    """A prompt answered `count` times: `count` versions of one answer."""
    conversation = Conversation.objects.create(user=user, model=settings.CHAT_MODEL, title="Many versions")
    prompt = conversation.messages.create(role="user", content="Again?")
    Message.objects.bulk_create(
        Message(conversation=conversation, parent=prompt, role="assistant", content=f"answer {index}")
        for index in range(count)
    )
    return conversation


@contextmanager
def model_comparisons() -> Iterator[list[int]]:
    """Count comparisons of model instances (Model.__eq__) made inside the block."""
    count = [0]
    original = Model.__eq__

    def counting(self: Model, other: object) -> bool:
        count[0] += 1
        return original(self, other)

    Model.__eq__ = counting  # type: ignore[method-assign,assignment]
    try:
        yield count
    finally:
        Model.__eq__ = original  # type: ignore[method-assign]


RUNS = 3


def timed(walk):  # type: ignore[no-untyped-def]
    """`walk()`'s result and the fewest seconds it took in RUNS runs."""
    fastest = float("inf")
    for _ in range(RUNS):
        began = time.perf_counter()
        result = walk()
        fastest = min(fastest, time.perf_counter() - began)
    return result, fastest


def test_the_thread_of_a_5000_message_conversation_and_its_versions_are_read_in_linear_time(alice):
    tree = MessageTree(chain(alice))

    with model_comparisons() as comparisons:
        thread, walked = timed(tree.thread)
        versions, counted = timed(lambda: [tree.versions(message) for message in thread])

    assert [message.content for message in thread] == [f"message {index}" for index in range(LONG)]
    assert {(v.position, v.count, v.previous, v.next) for v in versions} == {(1, 1, None, None)}
    assert comparisons[0] < LONG  # none per pair of messages
    assert walked < WALK_BOUND_S
    assert counted < WALK_BOUND_S


def test_each_of_5000_versions_knows_its_place_in_linear_time(alice):
    tree = MessageTree(versions_of_one_prompt(alice))
    answers = tree.children(tree.messages[0])

    with model_comparisons() as comparisons:
        versions, elapsed = timed(lambda: [tree.versions(answer) for answer in answers])

    assert [v.position for v in versions] == list(range(1, LONG + 1))
    assert {v.count for v in versions} == {LONG}
    assert (versions[0].previous, versions[0].next) == (None, answers[1])
    assert (versions[-1].previous, versions[-1].next) == (answers[-2], None)
    assert comparisons[0] < LONG
    assert elapsed < WALK_BOUND_S


def test_choosing_the_first_prompt_of_5000_versions_finds_the_newest_answer_in_linear_time(alice):
    tree = MessageTree(versions_of_one_prompt(alice))

    newest, elapsed = timed(lambda: tree.newest_leaf(tree.messages[0]))

    assert newest.content == f"answer {LONG - 1}"
    assert elapsed < WALK_BOUND_S


def test_a_loop_in_the_saved_tree_ends_every_walk(alice):
    # Bad data (the first message made to follow the last) must not loop forever.
    conversation = chain(alice, length=4)
    first, *_, last = conversation.messages.all()
    Message.objects.filter(pk=first.pk).update(parent=last)
    tree = MessageTree(conversation)

    assert [message.content for message in tree.path(last)] == ["message 0", "message 1", "message 2", "message 3"]
    assert tree.newest_leaf(first).content == "message 3"


def test_the_markdown_export_of_a_5000_message_conversation_answers_in_seconds(alice, alice_client):
    conversation = chain(alice)
    url = reverse("generation:conversation_export_markdown", args=[conversation.id])

    response, elapsed = timed(lambda: alice_client.get(url))

    assert response.status_code == 200
    assert response.content.decode().count("message ") == LONG
    assert elapsed < VIEW_BOUND_S


def test_the_page_of_a_long_conversation_compares_no_message_with_another(alice, alice_client):
    # Rendering thousands of messages is the template's (linear) time; the tree's walk
    # adds no comparison per pair of messages (the quadratic one made 500,000 here).
    conversation = chain(alice, length=1_000)

    with model_comparisons() as comparisons:
        response = alice_client.get(reverse("generation:conversation", args=[conversation.id]))

    assert response.status_code == 200
    assert "message 999" in response.content.decode()
    assert comparisons[0] < 1_000
