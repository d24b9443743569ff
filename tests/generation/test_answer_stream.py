from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from channels.testing import ApplicationCommunicator
from django.test import RequestFactory

from generation import services
from generation.models import Conversation, Message
from generation.views import answer_events
from inference.generators import SyntheticGenerator
from inference.streams import StreamEvent
from infrastructure import sse
from tests.support.engines import install_engine, wait_for_terminal
from tests.support.streams import answer_in_new_conversation, application, get_stream, parse_sse, session_headers

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queue(alice, bob, stream_store):
    """One generation at a time: bob's long answer runs while two of alice's wait behind it."""
    engine = install_engine(stream_store, SyntheticGenerator(tokens_per_s=200), max_concurrent=1)
    answers = [
        answer_in_new_conversation(bob, max_tokens=1000),
        answer_in_new_conversation(alice, max_tokens=4),
        answer_in_new_conversation(alice, max_tokens=4),
    ]
    yield answers
    for answer in answers:
        stream_store.cancel(answer.stream_id)
    engine.stop(10)


@pytest.fixture
def answer(alice, fast_engine):
    conversation = services.conversation_create(user=alice)
    _, answer = services.message_send(conversation=conversation, prompt="Hello there")
    wait_for_terminal(fast_engine.store, answer.stream_id)
    return answer


async def test_owner_reads_tokens_then_the_saved_answer(alice_client, answer):
    response = await get_stream(answer.get_stream_url(), session_headers(alice_client))

    assert response["status"] == 200
    headers = dict(response["headers"])
    assert headers[b"Content-Type"].startswith(b"text/event-stream")
    assert headers[b"Cache-Control"] == b"no-cache"
    assert headers[b"X-Accel-Buffering"] == b"no"
    events = parse_sse(response["body"])
    tokens, done = events[:-1], events[-1]
    text = "".join(json.loads(e["data"])["delta"] for e in tokens)
    saved = await Message.objects.aget(pk=answer.pk)
    assert text == saved.content
    assert len(text.split()) == 12
    assert done["event"] == "done"
    assert 'data-status="complete"' in done["data"]
    assert saved.content in done["data"]
    assert int(done["id"]) == 13


async def test_last_event_id_resumes_after_that_event(alice_client, answer, fast_engine):
    all_events = fast_engine.store.events(answer.stream_id)
    headers = [*session_headers(alice_client), (b"last-event-id", b"10")]

    events = parse_sse((await get_stream(answer.get_stream_url(), headers))["body"])

    expected = "".join(e.data["delta"] for e in all_events[10:-1])
    assert json.loads(events[0]["data"])["delta"] == expected
    assert [e["event"] for e in events] == ["token", "done"]


async def test_after_query_parameter_resumes_too(alice_client, answer):
    events = parse_sse((await get_stream(answer.get_stream_url() + "?after=12", session_headers(alice_client)))["body"])
    assert [e["event"] for e in events] == ["done"]


async def test_resuming_after_the_final_event_ends_the_response_empty(alice_client, answer):
    response = await get_stream(answer.get_stream_url() + "?after=13", session_headers(alice_client))
    assert response["status"] == 200
    assert parse_sse(response["body"]) == []


@pytest.mark.parametrize("bad", [b"abc", b"-1", b"1.5"])
async def test_malformed_resume_point_is_a_400(alice_client, answer, bad):
    headers = [*session_headers(alice_client), (b"last-event-id", bad)]
    assert (await get_stream(answer.get_stream_url(), headers))["status"] == 400


async def test_bob_gets_404_for_alices_stream(bob_client, answer):
    response = await get_stream(answer.get_stream_url(), session_headers(bob_client))
    assert response["status"] == 404
    assert b"data:" not in response["body"]


async def test_anonymous_reader_is_refused(answer):
    response = await get_stream(answer.get_stream_url(), [(b"host", b"localhost")])
    assert response["status"] == 403


async def test_unknown_stream_is_404(alice_client, fast_engine):
    assert (await get_stream("/chat/streams/0123456789abcdef/", session_headers(alice_client)))["status"] == 404


async def test_answer_whose_stream_is_gone_is_settled_as_interrupted(alice, alice_client, stream_store):
    conversation = await Conversation.objects.acreate(user=alice, model="smollm2-135m-instruct")
    orphan = await Message.objects.acreate(
        conversation=conversation, role="assistant", status="streaming", stream_id="gone", content="Half an ans"
    )

    events = parse_sse((await get_stream(orphan.get_stream_url(), session_headers(alice_client)))["body"])

    assert [e["event"] for e in events] == ["done"]
    assert 'data-status="interrupted"' in events[0]["data"]
    assert "Half an ans" in events[0]["data"]
    await orphan.arefresh_from_db()
    assert orphan.status == "interrupted"
    assert orphan.content == "Half an ans"


async def test_waiting_answer_hears_its_place_in_the_queue_live_then_streams(alice_client, queue, stream_store):
    running, _, third = queue
    scope = {"type": "http", "method": "GET", "path": third.get_stream_url(), "query_string": b""}
    communicator = ApplicationCommunicator(application, {**scope, "headers": session_headers(alice_client)})
    await communicator.send_input({"type": "http.request", "body": b""})
    try:
        assert (await communicator.receive_output(5))["status"] == 200
        body = b""
        while b"event: status" not in body:
            body += (await communicator.receive_output(5))["body"]
        waiting = parse_sse(body)

        await sync_to_async(stream_store.cancel)(running.stream_id)  # bob's answer stops: the queue moves
        while True:
            chunk = await communicator.receive_output(10)
            body += chunk.get("body", b"")
            if not chunk.get("more_body"):
                break
    finally:
        await communicator.send_input({"type": "http.disconnect"})
        await communicator.wait()

    assert waiting == [{"data": '{"state":"queued","ahead":1}', "id": "1", "event": "status"}]
    events = parse_sse(body)
    kinds = [e["event"] for e in events]
    assert kinds == ["status", "status", "status", *["token"] * (len(events) - 4), "done"]
    assert [json.loads(e["data"]) for e in events[:3]] == [
        {"state": "queued", "ahead": 1},
        {"state": "queued", "ahead": 0},
        {"state": "running"},
    ]
    assert [int(e["id"]) for e in events[:3]] == [1, 2, 3]
    assert int(events[-1]["id"]) == 8
    saved = await Message.objects.aget(pk=third.pk)
    assert "".join(json.loads(e["data"])["delta"] for e in events[3:-1]) == saved.content
    assert saved.status == "complete"
    assert saved.completion_tokens == 4


async def test_late_and_resumed_readers_get_the_status_events_in_order(alice_client, queue, stream_store):
    running, _, third = queue
    await sync_to_async(stream_store.cancel)(running.stream_id)
    await sync_to_async(wait_for_terminal)(stream_store, third.stream_id)
    headers = session_headers(alice_client)

    late = parse_sse((await get_stream(third.get_stream_url(), headers))["body"])
    resumed = parse_sse((await get_stream(third.get_stream_url() + "?after=2", headers))["body"])

    assert [(e["event"], e["id"]) for e in late] == [
        ("status", "1"),
        ("status", "2"),
        ("status", "3"),
        ("token", "7"),
        ("done", "8"),
    ]
    assert [(e["event"], e["id"]) for e in resumed] == [("status", "3"), ("token", "7"), ("done", "8")]
    assert json.loads(resumed[0]["data"]) == {"state": "running"}
    assert json.loads(resumed[1]["data"])["delta"] == (await Message.objects.aget(pk=third.pk)).content


async def test_an_answer_that_starts_at_once_gets_no_status_events(alice_client, answer, fast_engine):
    events = parse_sse((await get_stream(answer.get_stream_url(), session_headers(alice_client)))["body"])
    assert [e["event"] for e in events] == ["token", "done"]
    assert fast_engine.store.events(answer.stream_id)[0].type == "token"


def test_answer_events_coalesce_token_runs_around_status_events_in_order():
    events = [
        StreamEvent(1, "status", {"state": "queued", "ahead": 1}),
        StreamEvent(2, "status", {"state": "running"}),
        StreamEvent(3, "token", {"delta": "a"}),
        StreamEvent(4, "token", {"delta": "b"}),
        StreamEvent(5, "done", {}),
    ]
    assert answer_events(events) == (
        b'id: 1\nevent: status\ndata: {"state":"queued","ahead":1}\n\n'
        b'id: 2\nevent: status\ndata: {"state":"running"}\n\n'
        b'id: 4\nevent: token\ndata: {"delta":"ab"}\n\n'
    )


def test_resume_point_prefers_the_query_over_the_header():
    requests = RequestFactory()
    assert sse.resume_point(requests.get("/", {"after": "7"}, headers={"Last-Event-ID": "3"})) == 7
    assert sse.resume_point(requests.get("/", headers={"Last-Event-ID": "3"})) == 3
    assert sse.resume_point(requests.get("/")) == 0
