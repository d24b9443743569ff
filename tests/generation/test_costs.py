"""The cost of each answer in the chat, and of the conversation so far, where models have prices."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.models import Price, UsageRecord
from accounts.prices import cost_shown
from generation import services
from generation.models import Conversation, Message
from generation.views import _message_html
from tests.support.chat import eager_engine, fast_engine_run_eagerly

__all__ = ["eager_engine", "fast_engine_run_eagerly"]  # fixtures, used by name

pytestmark = pytest.mark.django_db


@pytest.fixture
def priced(settings) -> Price:
    return Price.objects.create(
        model=settings.CHAT_MODEL,
        currency="EUR",
        input_per_million=Decimal(3),
        output_per_million=Decimal(15),
        valid_from=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    )


def answered(user, *prompts: str) -> tuple[Conversation, list[Message]]:
    """A conversation of `user` with an answer to each prompt (the eager engine ends each at once)."""
    conversation = services.conversation_create(user=user)
    answers = [services.message_send(conversation=conversation, prompt=prompt)[1] for prompt in prompts]
    for answer in answers:
        answer.refresh_from_db()  # saved as it ended
    return conversation, answers


def cost_of_answer(answer: Message) -> Decimal:
    cost = UsageRecord.objects.get(stream_id=answer.stream_id).cost
    assert cost is not None
    return cost


def test_each_priced_answer_shows_its_cost_under_it(alice, alice_client, fast_engine, priced):
    conversation, answers = answered(alice, "Hello", "And again")

    page = alice_client.get(conversation.get_absolute_url()).content.decode()

    for answer in answers:
        assert f'<span data-role="cost">{cost_shown(cost_of_answer(answer))} EUR</span>' in page
    assert page.count('data-role="cost"') == 2


def test_the_conversation_header_shows_its_cost_so_far_every_version_included(alice, alice_client, fast_engine, priced):
    conversation, answers = answered(alice, "Hello")
    regenerated = services.message_regenerate(answer=answers[0])

    page = alice_client.get(conversation.get_absolute_url()).content.decode()

    total = cost_of_answer(answers[0]) + cost_of_answer(regenerated)
    assert f"Cost so far: {cost_shown(total)} EUR" in page


def test_without_prices_the_chat_shows_no_cost(alice, alice_client, fast_engine):
    conversation, _ = answered(alice, "Hello")

    page = alice_client.get(conversation.get_absolute_url()).content.decode()

    assert 'data-role="cost"' not in page
    assert "Cost so far" not in page


def test_the_saved_answer_sent_at_the_end_of_its_stream_shows_its_cost(alice, fast_engine, priced):
    _, (answer,) = answered(alice, "Hello")

    html = _message_html(answer.pk)

    assert f'<span data-role="cost">{cost_shown(cost_of_answer(answer))} EUR</span>' in html


def test_the_costs_of_a_longer_conversation_take_no_more_queries(alice, alice_client, fast_engine, priced):
    short, _ = answered(alice, "One")
    long, _ = answered(alice, "One", "Two", "Three", "Four")

    with CaptureQueriesContext(connection) as one_answer:
        alice_client.get(short.get_absolute_url())
    with CaptureQueriesContext(connection) as four_answers:
        alice_client.get(long.get_absolute_url())

    assert len(four_answers) == len(one_answer)


def test_bobs_conversation_counts_his_answers_alone(alice, bob, bob_client, fast_engine, priced):
    answered(alice, "Hello", "More")
    conversation, (answer,) = answered(bob, "Hi")

    page = bob_client.get(conversation.get_absolute_url()).content.decode()

    assert f"Cost so far: {cost_shown(cost_of_answer(answer))} EUR" in page


def test_bob_cannot_see_alices_conversation_or_its_cost(alice, bob_client, fast_engine, priced):
    conversation, _ = answered(alice, "Hello")

    response = bob_client.get(conversation.get_absolute_url())

    assert response.status_code == 404
    assert b"Cost so far" not in response.content
