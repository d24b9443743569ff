from __future__ import annotations

import json

import pytest
from channels.routing import URLRouter
from channels.testing import HttpCommunicator
from django.conf import settings

from generation import routing, services
from generation.consumers import resume_point, token_events
from generation.models import Conversation, Message
from generation.streams import StreamEvent
from tests.conftest import wait_for_terminal

pytestmark = pytest.mark.django_db(transaction=True)

# The stream routes as chatsite.asgi mounts them, without its start-up side effects.
application = URLRouter(routing.http_urlpatterns)


def session_headers(client) -> list[tuple[bytes, bytes]]:
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    return [(b"cookie", cookie.encode()), (b"host", b"localhost")]


async def get_stream(path: str, headers: list[tuple[bytes, bytes]], timeout: float = 30) -> dict:
    communicator = HttpCommunicator(application, "GET", path, headers=headers)
    try:
        return await communicator.get_response(timeout=timeout)
    finally:
        # As daphne does once a response is complete; the consumer then closes its DB connection.
        await communicator.send_input({"type": "http.disconnect"})
        await communicator.wait()


def parse_sse(body: bytes) -> list[dict]:
    events = []
    for block in body.decode().split("\n\n"):
        fields: dict = {"data": []}
        for line in block.splitlines():
            name, _, value = line.partition(": ")
            if name == "data":
                fields["data"].append(value)
            elif name in ("id", "event"):
                fields[name] = value
        if fields["data"]:
            fields["data"] = "\n".join(fields["data"])
            events.append(fields)
    return events


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
    assert headers[b"Cache-Control"] == b"no-cache" and headers[b"X-Accel-Buffering"] == b"no"
    events = parse_sse(response["body"])
    tokens, done = events[:-1], events[-1]
    text = "".join(json.loads(e["data"])["delta"] for e in tokens)
    saved = await Message.objects.aget(pk=answer.pk)
    assert text == saved.content and len(text.split()) == 12
    assert done["event"] == "done"
    assert 'data-status="complete"' in done["data"] and saved.content in done["data"]
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
    assert response["status"] == 200 and parse_sse(response["body"]) == []


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
    assert 'data-status="interrupted"' in events[0]["data"] and "Half an ans" in events[0]["data"]
    await orphan.arefresh_from_db()
    assert orphan.status == "interrupted" and orphan.content == "Half an ans"


def test_token_events_coalesce_runs_and_keep_the_last_sequence_number():
    events = [
        StreamEvent(1, "token", {"delta": "a"}),
        StreamEvent(2, "token", {"delta": "b"}),
        StreamEvent(3, "done", {}),
    ]
    assert token_events(events) == b'id: 2\nevent: token\ndata: {"delta":"ab"}\n\n'


def test_resume_point_prefers_the_query_over_the_header():
    scope = {"query_string": b"after=7", "headers": [(b"last-event-id", b"3")]}
    assert resume_point(scope) == 7
    assert resume_point({"query_string": b"", "headers": [(b"last-event-id", b"3")]}) == 3
    assert resume_point({"query_string": b"", "headers": []}) == 0
