"""POST /v1/responses (OpenAI's Responses API) through Django's test client and the synthetic model.

The official openai client reads these answers in tests/e2e/test_api_responses_live.py.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client

from accounts.models import UsageRecord
from accounts.services import account_for, api_key_create
from api.models import StoredResponse
from api.response_events import ResponseEvents, ResponseHead, response_sse
from inference.generators import SYNTHETIC_TEXT, SyntheticGenerator
from inference.streams import StreamEvent
from tests.support.api_client import MODEL, RATE_HEADERS, assert_error, get, post, sse
from tests.support.engines import install_engine, wait_for_terminal

pytestmark = pytest.mark.django_db(transaction=True)

WORDS = SYNTHETIC_TEXT.split()
ANSWER = " ".join(WORDS[:12])  # conftest's fast_engine answers 12 words
HELLO = {"model": MODEL, "input": "Hello there"}


@pytest.fixture
def alice_key(alice) -> str:
    return api_key_create(user=alice, name="test")[1]


@pytest.fixture
def bob_key(bob) -> str:
    return api_key_create(user=bob, name="test")[1]


@pytest.fixture
def seen(fast_engine, monkeypatch) -> list[list[dict]]:
    """The messages the model was given, for each generation."""
    prompts: list[list[dict]] = []
    original = fast_engine.submit

    def submit(job):
        prompts.append(job.prompt)
        return original(job)

    monkeypatch.setattr(fast_engine, "submit", submit)
    return prompts


@pytest.fixture
def slow_engine(stream_store):
    """20 words a second, as long as max_output_tokens: a generation still running when asked."""
    engine = install_engine(stream_store, SyntheticGenerator(tokens_per_s=20))
    yield engine
    engine.stop(10)


def events_of(response) -> list[dict]:
    parsed = [(event_id, json.loads(data)) for event_id, data in sse(response)]
    assert all(int(event_id) == event["sequence_number"] for event_id, event in parsed)
    return [event for _, event in parsed]


def text_of(events: list[dict]) -> str:
    return "".join(event["delta"] for event in events if event["type"] == "response.output_text.delta")


def test_a_response_answers_the_input_as_openai_shapes_it(alice, alice_key, fast_engine):
    response = post("/v1/responses", {**HELLO, "instructions": "Be brief."}, alice_key)

    assert response.status_code == 200
    assert all(response.has_header(name) for name in RATE_HEADERS)
    body = response.json()
    assert body["id"].startswith("resp_")
    assert (body["object"], body["status"], body["model"], body["error"]) == ("response", "completed", MODEL, None)
    assert body["instructions"] == "Be brief."
    (message,) = body["output"]
    assert (message["type"], message["role"], message["status"]) == ("message", "assistant", "completed")
    assert message["content"] == [{"type": "output_text", "text": ANSWER, "annotations": [], "logprobs": []}]
    assert body["usage"] == {
        "input_tokens": 4,  # "Be brief." and "Hello there"
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 12,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 16,
    }
    record = UsageRecord.objects.get(user=alice)
    assert (record.channel, record.completion_tokens, f"resp_{record.stream_id}") == ("api", 12, body["id"])
    stored = get(f"/v1/responses/{body['id']}", alice_key).json()
    assert stored["output"] == body["output"]
    assert stored["usage"] == body["usage"]


def test_max_output_tokens_ends_the_response_incomplete(alice_key, fast_engine):
    body = post("/v1/responses", {**HELLO, "max_output_tokens": 3}, alice_key).json()

    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["content"][0]["text"] == " ".join(WORDS[:3])
    assert body["max_output_tokens"] == 3


def test_input_items_instructions_and_sampling_reach_the_model(alice_key, seen):
    request = {
        "model": MODEL,
        "instructions": "Answer in French.",
        "input": [
            {"role": "developer", "content": "Be kind."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Bonjour"}]},
        ],
        "temperature": 0,
        "top_p": 0.5,
    }
    body = post("/v1/responses", request, alice_key).json()

    assert seen == [
        [
            {"role": "system", "content": "Answer in French."},
            {"role": "system", "content": "Be kind."},
            {"role": "user", "content": "Bonjour"},
        ]
    ]
    assert (body["temperature"], body["top_p"]) == (0.0, 0.5)


def test_a_streamed_response_follows_the_responses_event_sequence(alice_key, fast_engine):
    response = post("/v1/responses", {**HELLO, "stream": True}, alice_key)

    assert response["Content-Type"].startswith("text/event-stream")
    events = events_of(response)
    kinds = [event["type"] for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert text_of(events) == events[-4]["text"] == ANSWER
    assert events[0]["response"]["status"] == "in_progress"
    completed = events[-1]["response"]
    assert completed["status"] == "completed"
    assert completed["usage"]["output_tokens"] == 12
    assert completed["output"][0]["content"][0]["text"] == ANSWER
    assert len({events[0]["response"]["id"], completed["id"]}) == 1
    # Its end was saved as it went out.
    assert StoredResponse.objects.get(pk=completed["id"]).output_text == ANSWER


def test_previous_response_id_continues_the_conversation(alice_key, seen):
    first = post("/v1/responses", {**HELLO, "instructions": "Be brief."}, alice_key).json()
    second = post(
        "/v1/responses", {"model": MODEL, "input": "And then?", "previous_response_id": first["id"]}, alice_key
    ).json()

    assert second["status"] == "completed"
    assert second["previous_response_id"] == first["id"]
    # The previous response's messages and answer; its instructions are not carried over.
    assert seen[1] == [
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": ANSWER},
        {"role": "user", "content": "And then?"},
    ]
    third = post("/v1/responses", {"model": MODEL, "input": "Last", "previous_response_id": second["id"]}, alice_key)
    assert third.status_code == 200
    assert len(seen[2]) == 5
    assert third.json()["usage"]["input_tokens"] == 2 + 12 + 2 + 12 + 1


def test_bob_cannot_read_continue_cancel_or_delete_alices_response(alice_key, bob_key, fast_engine):
    alices = post("/v1/responses", HELLO, alice_key).json()["id"]
    unknown = "resp_0123456789abcdef0123456789abcdef"

    for path in (alices, unknown):
        error = assert_error(get(f"/v1/responses/{path}", bob_key), 404, "response_not_found")
        assert error["message"] == f"Response with id {path!r} not found."
        assert_error(get(f"/v1/responses/{path}?stream=true", bob_key), 404, "response_not_found")
        assert_error(post(f"/v1/responses/{path}/cancel", {}, bob_key), 404, "response_not_found")
        assert_error(delete(f"/v1/responses/{path}", bob_key), 404, "response_not_found")
        continued = post("/v1/responses", {**HELLO, "previous_response_id": path}, bob_key)
        assert_error(continued, 400, "previous_response_not_found", "previous_response_id")
    assert StoredResponse.objects.filter(pk=alices).exists()
    assert get(f"/v1/responses/{alices}", alice_key).status_code == 200


def delete(path: str, key: str):
    return Client().delete(path, HTTP_AUTHORIZATION=f"Bearer {key}")


def test_a_response_not_stored_cannot_be_read_or_continued(alice, alice_key, fast_engine):
    body = post("/v1/responses", {**HELLO, "store": False}, alice_key).json()

    assert body["status"] == "completed"
    assert body["store"] is False
    assert not StoredResponse.objects.exists()
    assert_error(get(f"/v1/responses/{body['id']}", alice_key), 404, "response_not_found")
    continued = post("/v1/responses", {**HELLO, "previous_response_id": body["id"]}, alice_key)
    assert_error(continued, 400, "previous_response_not_found", "previous_response_id")
    refused = post("/v1/responses", {**HELLO, "store": False, "background": True}, alice_key)
    assert_error(refused, 400, None, "store")


def test_deleting_a_response_forgets_it(alice_key, fast_engine):
    response_id = post("/v1/responses", HELLO, alice_key).json()["id"]

    deleted = delete(f"/v1/responses/{response_id}", alice_key)

    assert deleted.json() == {"id": response_id, "object": "response.deleted", "deleted": True}
    assert_error(get(f"/v1/responses/{response_id}", alice_key), 404, "response_not_found")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        ([1, 2], None),
        ({"model": MODEL}, "input"),
        ({**HELLO, "input": []}, "input"),
        ({**HELLO, "input": [{"role": "robot", "content": "x"}]}, "input.0.role"),
        ({**HELLO, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, None),
        ({**HELLO, "temperature": 3}, "temperature"),
        ({**HELLO, "top_p": 0}, "top_p"),
        ({**HELLO, "max_output_tokens": 0}, "max_output_tokens"),
        ({**HELLO, "max_output_tokens": 2**40}, "max_output_tokens"),
        ({**HELLO, "stream": "yes"}, "stream"),
        ({**HELLO, "tools": [{"type": "web_search"}]}, "tools"),
        ({**HELLO, "text": {"format": {"type": "json_object"}}}, "text.format.type"),
        ({**HELLO, "reasoning": {"effort": "high"}}, "reasoning"),
        ({**HELLO, "colour": "red"}, "colour"),
        ({**HELLO, "previous_response_id": "r" * 101}, "previous_response_id"),
    ],
)
def test_malformed_requests_are_400_and_start_nothing(alice, alice_key, fast_engine, body, param):
    error = assert_error(post("/v1/responses", body, alice_key), 400, None)
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param
    assert not UsageRecord.objects.filter(user=alice).exists()


def test_oversized_and_unauthorised_requests_get_the_error_object(alice_key, fast_engine, settings):
    assert_error(post("/v1/responses", HELLO, None), 401, "invalid_api_key")
    assert_error(get("/v1/responses/resp_x", "cs-not-a-key"), 401, "invalid_api_key")
    assert_error(post("/v1/responses", {**HELLO, "model": "gpt-9"}, alice_key), 404, "model_not_found", "model")
    assert_error(get("/v1/responses/resp_x?starting_after=x&stream=true", alice_key), 400, None, "starting_after")
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    assert_error(post("/v1/responses", {**HELLO, "input": "x " * 1000}, alice_key), 413, "request_too_large")


def test_a_plan_limit_names_the_responses_field(alice, alice_key, fast_engine):
    limit = account_for(alice).limits.max_tokens_per_request
    refused = post("/v1/responses", {**HELLO, "max_output_tokens": limit + 1}, alice_key)
    assert_error(refused, 400, None, "max_output_tokens")


def test_a_background_response_answers_at_once_and_is_read_back_when_done(alice_key, fast_engine, stream_store):
    body = post("/v1/responses", {**HELLO, "background": True}, alice_key).json()

    assert (body["status"], body["background"], body["output"], body["usage"]) == ("in_progress", True, [], None)
    wait_for_terminal(stream_store, body["id"].removeprefix("resp_"))
    done = get(f"/v1/responses/{body['id']}", alice_key).json()
    assert done["status"] == "completed"
    assert done["output"][0]["content"][0]["text"] == ANSWER


def test_a_resumed_stream_continues_without_gap_or_repeat(alice_key, fast_engine):
    whole = events_of(post("/v1/responses", {**HELLO, "stream": True, "background": True}, alice_key))
    response_id = whole[0]["response"]["id"]

    for after in (0, 3, 7, len(whole) - 2):
        resumed = events_of(get(f"/v1/responses/{response_id}?stream=true&starting_after={after}", alice_key))
        assert [event["sequence_number"] for event in resumed] == list(range(after + 1, len(whole)))
        assert [event["type"] for event in resumed] == [event["type"] for event in whole[after + 1 :]]
        assert text_of(whole[: after + 1]) + text_of(resumed) == ANSWER
    assert events_of(get(f"/v1/responses/{response_id}?stream=true", alice_key)) == whole


def test_cancel_stops_a_running_response(alice, alice_key, slow_engine, stream_store):
    body = post("/v1/responses", {**HELLO, "background": True, "max_output_tokens": 500}, alice_key).json()

    cancelled = post(f"/v1/responses/{body['id']}/cancel", {}, alice_key)

    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["output"][0]["status"] == "incomplete"
    record = UsageRecord.objects.get(user=alice)
    assert record.status == "stopped"
    assert record.completion_tokens < 500
    assert get(f"/v1/responses/{body['id']}", alice_key).json()["status"] == "cancelled"


def test_a_streamed_response_ends_with_response_failed_on_an_error():
    head = ResponseHead(stream_id="abc", model=MODEL, created_at=0)
    numbered = ResponseEvents(head)
    events = [
        *numbered.opening(),
        *numbered.take(StreamEvent(1, "token", {"delta": "Hi"})),
        *numbered.take(StreamEvent(2, "status", {"state": "running"})),
        *numbered.take(StreamEvent(3, "error", {"message": "boom", "code": "generation_failed"})),
    ]

    assert [event["type"] for event in events][-2:] == ["response.output_text.delta", "response.failed"]
    failed = events[-1]["response"]
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": "generation_failed", "message": "boom"}
    assert failed["output"][0]["content"][0]["text"] == "Hi"
    assert [event["sequence_number"] for event in events] == [0, 1, 2, 3, 4, 5]
    framed = response_sse(events, after=4).decode()
    assert framed.startswith("id: 5\nevent: response.failed\ndata: {")
