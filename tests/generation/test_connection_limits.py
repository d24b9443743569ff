"""Per-user limits on open streams and sockets, and the chat socket's message rate."""

from __future__ import annotations

import gc
import json

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings

from accounts.models import UsageRecord
from accounts.services import api_key_create
from generation import connection_limits, routing, services
from generation.connection_limits import ConnectionCounter, MessageRate, TooManyConnections, Verdict
from generation.consumers import POLICY_VIOLATION, TOO_MANY_SOCKETS
from generation.models import Conversation
from tests.support.engines import wait_for_terminal
from tests.support.streams import get_stream, session_headers

ORIGIN = (b"origin", b"http://localhost")
CHAT = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Hello"}]}


@pytest.fixture(autouse=True)
def counters(monkeypatch):
    """Counts of this test's own: a place another test left held must not refuse here."""
    streams = ConnectionCounter("event streams", lambda: django_settings.CHAT_MAX_STREAMS_PER_USER)
    sockets = ConnectionCounter("chat sockets", lambda: django_settings.CHAT_MAX_SOCKETS_PER_USER)
    monkeypatch.setattr(connection_limits, "streams", streams)
    monkeypatch.setattr(connection_limits, "sockets", sockets)
    return streams, sockets


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# The counters alone.


def test_a_user_holds_up_to_the_limit_and_is_refused_past_it():
    counter = ConnectionCounter("event streams", lambda: 2)
    first, second = counter.hold(1), counter.hold(1)

    with pytest.raises(TooManyConnections) as refused:
        counter.hold(1)

    assert refused.value.message == "Too many open event streams: at most 2 per user."
    assert counter.open_for(1) == 2
    first.release()
    second.release()


def test_a_place_given_back_is_free_again_and_giving_back_twice_frees_one():
    counter = ConnectionCounter("event streams", lambda: 1)
    with counter.hold(1) as held:
        pass
    held.release()  # once more: nothing happens

    again = counter.hold(1)

    assert counter.open_for(1) == 1
    again.release()
    assert counter.open_for(1) == 0


def test_each_user_is_counted_alone():
    counter = ConnectionCounter("chat sockets", lambda: 1)
    alices = counter.hold(1)

    bobs = counter.hold(2)

    assert counter.open_for(1) == counter.open_for(2) == 1
    alices.release()
    bobs.release()


def test_a_place_whose_holder_is_dropped_unreleased_is_given_back():
    counter = ConnectionCounter("event streams", lambda: 1)
    counter.hold(1)  # dropped at once, as a response that never began would be
    gc.collect()

    assert counter.open_for(1) == 0
    counter.hold(1).release()


async def test_a_stream_holds_its_place_until_it_ends():
    counter = ConnectionCounter("event streams", lambda: 1)

    async def chunks():
        yield b"one"
        assert counter.open_for(1) == 1
        yield b"two"

    streamed = [chunk async for chunk in connection_limits.held_open(counter.hold(1), chunks())]

    assert streamed == [b"one", b"two"]
    assert counter.open_for(1) == 0


async def test_a_stream_its_reader_leaves_gives_its_place_back():
    counter = ConnectionCounter("event streams", lambda: 1)

    async def endless():
        while True:
            yield b"tick"

    stream = connection_limits.held_open(counter.hold(1), endless())
    assert await anext(stream) == b"tick"
    await stream.aclose()  # as Django closes it when the client disconnects

    assert counter.open_for(1) == 0


# The token bucket.


def test_a_burst_passes_at_once_then_messages_pass_at_the_rate():
    clock = Clock()
    rate = MessageRate(rate=2.0, burst=3, clock=clock)

    burst = [rate.check() for _ in range(3)]
    over = rate.check()
    clock.now += 0.5  # one message's worth at 2 a second
    refilled = rate.check()

    assert burst == [Verdict.ACCEPT] * 3
    assert over is Verdict.WARN
    assert refilled is Verdict.ACCEPT


def test_a_flood_is_warned_once_dropped_then_closed():
    rate = MessageRate(rate=1.0, burst=3, clock=Clock())
    verdicts = [rate.check() for _ in range(3 + 1 + 3)]

    assert verdicts == [Verdict.ACCEPT] * 3 + [Verdict.WARN] + [Verdict.DROP] * 2 + [Verdict.CLOSE]


def test_a_client_that_slows_down_until_the_bucket_is_full_is_forgiven():
    clock = Clock()
    rate = MessageRate(rate=1.0, burst=3, clock=clock)
    for _ in range(5):  # a burst, a warning, a dropped message
        rate.check()

    clock.now += 3  # the bucket is full again
    verdicts = [rate.check() for _ in range(3 + 2)]

    assert verdicts == [Verdict.ACCEPT] * 3 + [Verdict.WARN, Verdict.DROP]  # warned afresh, not closed


# The browser's answer stream.


@pytest.fixture
def answer(alice, fast_engine):
    conversation = services.conversation_create(user=alice)
    _, answer = services.message_send(conversation=conversation, prompt="Hello there")
    wait_for_terminal(fast_engine.store, answer.stream_id)
    return answer


@pytest.mark.django_db(transaction=True)
async def test_a_stream_past_the_users_limit_is_a_429_saying_why(alice, alice_client, answer, counters, settings):
    settings.CHAT_MAX_STREAMS_PER_USER = 1
    streams, _ = counters
    other = streams.hold(alice.pk)  # another of alice's streams, still open

    refused = await get_stream(answer.get_stream_url(), session_headers(alice_client))
    other.release()
    served = await get_stream(answer.get_stream_url(), session_headers(alice_client))

    assert refused["status"] == 429
    assert dict(refused["headers"])[b"Retry-After"] == b"5"
    assert refused["body"] == b"Too many open event streams: at most 1 per user. Try again in 5 s.\n"
    assert served["status"] == 200
    assert b"event: done" in served["body"]
    assert streams.open_for(alice.pk) == 0  # the served stream gave its place back


@pytest.mark.django_db(transaction=True)
async def test_bobs_streams_do_not_count_against_alice(alice, bob, alice_client, answer, counters, settings):
    settings.CHAT_MAX_STREAMS_PER_USER = 1
    streams, _ = counters
    bobs = streams.hold(bob.pk)

    served = await get_stream(answer.get_stream_url(), session_headers(alice_client))

    assert served["status"] == 200
    bobs.release()


# The API's streams.


@pytest.fixture
def alice_key(alice) -> str:
    return api_key_create(user=alice, name="test")[1]


def api(client, method: str, path: str, key: str, body: object = None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    if method == "POST":
        return client.post(path, json.dumps(body), content_type="application/json", **headers)
    return client.get(path, **headers)


@pytest.mark.django_db(transaction=True)
def test_an_api_stream_past_the_limit_is_a_429_and_starts_no_generation(
    alice, alice_key, client, counters, fast_engine, settings
):
    settings.CHAT_MAX_STREAMS_PER_USER = 1
    streams, _ = counters
    other = streams.hold(alice.pk)

    refused = api(client, "POST", "/v1/chat/completions", alice_key, {**CHAT, "stream": True})
    whole = api(client, "POST", "/v1/chat/completions", alice_key, CHAT)  # not a stream: not counted

    assert refused.status_code == 429
    assert refused["Retry-After"] == "5"
    assert refused.json() == {
        "error": {
            "message": "Too many open event streams: at most 1 per user.",
            "type": "rate_limit_error",
            "param": None,
            "code": "too_many_connections",
        }
    }
    assert whole.status_code == 200
    assert UsageRecord.objects.filter(user=alice).count() == 1  # the whole answer's only
    other.release()


@pytest.mark.django_db(transaction=True)
def test_resuming_an_api_stream_past_the_limit_is_a_429(alice, alice_key, client, counters, fast_engine, settings):
    settings.CHAT_MAX_STREAMS_PER_USER = 1
    streams, _ = counters
    completion = api(client, "POST", "/v1/chat/completions", alice_key, CHAT).json()
    other = streams.hold(alice.pk)

    refused = api(client, "GET", f"/v1/streams/{completion['id']}?after=0", alice_key)
    other.release()
    resumed = api(client, "GET", f"/v1/streams/{completion['id']}?after=0", alice_key)
    body = b"".join(resumed)  # the test client reads the stream to its end

    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "too_many_connections"
    assert resumed.status_code == 200
    assert body.endswith(b"data: [DONE]\n\n")
    assert streams.open_for(alice.pk) == 0


# The chat socket.


def chat_socket(conversation, client) -> WebsocketCommunicator:
    headers = [*session_headers(client), ORIGIN]
    return WebsocketCommunicator(routing.websocket_application, f"/ws/chat/{conversation.id}/", headers=headers)


@pytest.fixture
async def conversation(alice):
    return await Conversation.objects.acreate(user=alice, model="smollm2-135m-instruct")


@pytest.mark.django_db(transaction=True)
async def test_a_socket_past_the_users_limit_is_told_why_and_closed_with_4429(
    alice, alice_client, conversation, counters, fast_engine, settings
):
    settings.CHAT_MAX_SOCKETS_PER_USER = 1
    _, sockets = counters
    first = chat_socket(conversation, alice_client)
    assert (await first.connect())[0]

    second = chat_socket(conversation, alice_client)
    await second.connect()
    told = await second.receive_json_from(timeout=5)
    closed = await second.receive_output(timeout=5)
    await first.disconnect()
    third = chat_socket(conversation, alice_client)
    reopened, _ = await third.connect()
    await third.disconnect()

    assert told == {
        "type": "error",
        "code": "too_many_connections",
        "message": "Too many open chat sockets: at most 1 per user. Try again in 5 s.",
    }
    assert closed == {"type": "websocket.close", "code": TOO_MANY_SOCKETS}
    assert reopened  # the first one's place was given back as it closed
    assert sockets.open_for(alice.pk) == 0


@pytest.mark.django_db(transaction=True)
async def test_bobs_sockets_do_not_count_against_alice(alice, bob, alice_client, conversation, counters, settings):
    settings.CHAT_MAX_SOCKETS_PER_USER = 1
    _, sockets = counters
    bobs = sockets.hold(bob.pk)

    communicator = chat_socket(conversation, alice_client)
    connected, _ = await communicator.connect()
    await communicator.send_json_to({"type": "cancel"})

    assert connected
    assert await communicator.receive_nothing(0.1)  # open, and no error
    await communicator.disconnect()
    bobs.release()


@pytest.mark.django_db(transaction=True)
async def test_a_flooding_socket_is_warned_once_then_closed_with_1008(alice_client, conversation, settings):
    settings.CHAT_SOCKET_MESSAGES_PER_S = 0.001  # nothing refills during the test
    settings.CHAT_SOCKET_MESSAGE_BURST = 3
    communicator = chat_socket(conversation, alice_client)
    await communicator.connect()

    for _ in range(3 + 1 + 3 + 10):  # a burst, one over, the burst's worth more, and then some
        await communicator.send_to(text_data="x")
    replies = [await communicator.receive_output(timeout=5) for _ in range(3 + 1 + 1)]
    after_close = await communicator.receive_nothing(0.2)
    await communicator.disconnect()

    sent = [json.loads(reply["text"]) for reply in replies[:-1]]
    assert [reply["message"] for reply in sent[:3]] == ["Messages must be JSON objects."] * 3
    assert sent[3]["type"] == "error"
    assert sent[3]["code"] == "rate_limit_exceeded"
    assert "at most 0.001 a second" in sent[3]["message"]
    assert replies[-1] == {"type": "websocket.close", "code": POLICY_VIOLATION}
    assert after_close  # the rest of the flood went unanswered
