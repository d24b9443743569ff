"""POST /v1/responses through the official `openai` client against a real daphne and the real model."""

from __future__ import annotations

import openai
import pytest

from tests.support.livesite import user_with_api_key

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def alice(live_site) -> openai.OpenAI:
    key = user_with_api_key(live_site, "responses-alice")
    return openai.OpenAI(base_url=f"{live_site.base_url}/v1", api_key=key, max_retries=0)


@pytest.fixture(scope="module")
def bob(live_site) -> openai.OpenAI:
    key = user_with_api_key(live_site, "responses-bob")
    return openai.OpenAI(base_url=f"{live_site.base_url}/v1", api_key=key, max_retries=0)


def test_the_openai_client_creates_a_response(alice):
    response = alice.responses.create(
        model=MODEL, instructions="Answer in one short sentence.", input="Say hello.", temperature=0
    )

    assert response.id.startswith("resp_")
    assert response.status == "completed"
    assert response.output_text.strip()
    assert response.output[0].content[0].text == response.output_text
    assert response.usage.output_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert alice.responses.retrieve(response.id).output_text == response.output_text


def test_the_openai_client_streams_a_response(alice):
    events = list(alice.responses.create(model=MODEL, input="Say hello.", temperature=0, stream=True))

    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    completed = events[-1].response
    assert deltas == completed.output_text == events[-4].text
    assert completed.usage.output_tokens > 0


def test_previous_response_id_carries_the_conversation_across_two_calls(alice):
    first = alice.responses.create(model=MODEL, input="My name is Alice.", max_output_tokens=16, temperature=0)
    second = alice.responses.create(
        model=MODEL, input="What is my name?", previous_response_id=first.id, max_output_tokens=16, temperature=0
    )
    alone = alice.responses.create(model=MODEL, input="What is my name?", max_output_tokens=16, temperature=0)

    assert second.previous_response_id == first.id
    # The second call's prompt holds the first's input and answer.
    assert second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens


def test_a_resumed_response_stream_has_no_gap_or_repeat(alice):
    stream = alice.responses.create(
        model=MODEL, input="Write a short poem about rivers.", max_output_tokens=40, stream=True, background=True
    )
    first = []
    for event in stream:
        first.append(event)
        if len(first) == 8:
            break
    stream.close()  # the client goes away; a background response runs on
    response_id = first[0].response.id

    rest = list(alice.responses.retrieve(response_id, stream=True, starting_after=first[-1].sequence_number))

    events = first + rest
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[-1].type in ("response.completed", "response.incomplete")
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == events[-1].response.output_text == alice.responses.retrieve(response_id).output_text


def test_bob_cannot_read_continue_or_cancel_alices_response(alice, bob):
    response = alice.responses.create(model=MODEL, input="Say hello.", max_output_tokens=4)

    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.cancel(response.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.delete(response.id)
    with pytest.raises(openai.BadRequestError) as refused:
        bob.responses.create(model=MODEL, input="Go on.", previous_response_id=response.id)
    assert refused.value.code == "previous_response_not_found"
    assert alice.responses.retrieve(response.id).id == response.id


def test_a_background_response_can_be_cancelled_and_deleted(alice):
    response = alice.responses.create(model=MODEL, input="Count to a thousand.", max_output_tokens=500, background=True)
    assert response.status == "in_progress"

    cancelled = alice.responses.cancel(response.id)

    assert cancelled.status in ("cancelled", "completed", "incomplete")
    alice.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve(response.id)
