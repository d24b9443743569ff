"""The WebSocket consumer /ws/chat/<conversation>/."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from generation.models import Conversation, Message
from inference.generators import SyntheticGenerator
from tests.support.engines import install_engine
from tests.support.sockets import ORIGIN, socket
from tests.support.streams import answer_in_new_conversation, session_headers

pytestmark = pytest.mark.django_db(transaction=True)


async def receive_until_terminal(communicator: WebsocketCommunicator) -> list[dict]:
    received = []
    while True:
        message = await communicator.receive_json_from(timeout=10)
        received.append(message)
        if message["type"] in ("done", "error") and "seq" in message:
            return received


@pytest.fixture
async def conversation(alice):
    return await Conversation.objects.acreate(user=alice, model="smollm2-135m-instruct")


async def test_generate_streams_tokens_then_done_and_saves_the_answer(alice_client, conversation, fast_engine):
    communicator = socket(conversation.id, [*session_headers(alice_client), ORIGIN])
    connected, _ = await communicator.connect()
    assert connected

    await communicator.send_json_to({"type": "generate", "prompt": "Hello over a socket"})
    started = await communicator.receive_json_from(timeout=5)
    events = await receive_until_terminal(communicator)
    await communicator.disconnect()

    assert started["type"] == "started"
    tokens, done = events[:-1], events[-1]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert {e["type"] for e in tokens} == {"token"}
    assert done["type"] == "done"
    assert done["finish_reason"] == "stop"
    assert done["usage"]["completion_tokens"] == 12
    answer = await Message.objects.aget(pk=started["message_id"])
    assert answer.status == "complete"
    assert answer.content == "".join(e["delta"] for e in tokens)


async def test_a_waiting_generation_hears_its_place_in_the_queue_then_streams(
    alice_client, bob, conversation, stream_store
):
    engine = await database_sync_to_async(install_engine)(stream_store, SyntheticGenerator(200), max_concurrent=1)
    ahead = await database_sync_to_async(answer_in_new_conversation)(bob, max_tokens=1000)
    await Conversation.objects.filter(pk=conversation.pk).aupdate(max_tokens=8)
    communicator = socket(conversation.id, [*session_headers(alice_client), ORIGIN])
    await communicator.connect()
    await communicator.send_json_to({"type": "generate", "prompt": "Wait your turn"})
    started = await communicator.receive_json_from(timeout=5)
    waiting = await communicator.receive_json_from(timeout=5)

    await database_sync_to_async(stream_store.cancel)(ahead.stream_id)  # bob's answer stops: alice's runs
    events = await receive_until_terminal(communicator)
    await communicator.disconnect()
    await database_sync_to_async(engine.stop)(10)

    assert started["type"] == "started"
    assert waiting == {"type": "status", "seq": 1, "state": "queued", "ahead": 0}
    assert events[0] == {"type": "status", "seq": 2, "state": "running"}
    tokens, done = events[1:-1], events[-1]
    assert tokens
    assert {e["type"] for e in tokens} == {"token"}
    assert done["type"] == "done"
    assert [e["seq"] for e in events] == list(range(2, len(events) + 2))
    answer = await Message.objects.aget(pk=started["message_id"])
    assert answer.status == "complete"
    assert answer.completion_tokens == 8
    assert answer.content == "".join(e["delta"] for e in tokens)


async def test_cancel_stops_the_generation(alice_client, conversation, stream_store):
    from inference.generators import SyntheticGenerator
    from tests.support.engines import install_engine

    engine = await database_sync_to_async(install_engine)(stream_store, SyntheticGenerator(20, answer_words=64))
    communicator = socket(conversation.id, [*session_headers(alice_client), ORIGIN])
    await communicator.connect()
    await communicator.send_json_to({"type": "generate", "prompt": "Go on and on"})
    started = await communicator.receive_json_from(timeout=5)
    assert (await communicator.receive_json_from(timeout=5))["type"] == "token"

    await communicator.send_json_to({"type": "cancel"})
    events = await receive_until_terminal(communicator)
    await communicator.disconnect()
    engine.stop(5)

    assert events[-1]["type"] == "done"
    assert events[-1]["status"] == "stopped"
    answer = await Message.objects.aget(pk=started["message_id"])
    assert answer.status == "stopped"
    assert answer.completion_tokens < 64


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ("not json", "JSON"),
        ("[1, 2]", "JSON"),
        ("[" * 100_000, "JSON"),  # deeper than Python's parser goes
        ('{"type": "dance"}', "type must be"),
        ('{"type": "generate"}', "Type a message first."),
        ('{"type": "generate", "prompt": 42}', "Type a message first."),
        ('{"type": "generate", "prompt": "' + "x" * 40_000 + '"}', "at most"),
    ],
)
async def test_malformed_messages_get_an_error_and_keep_the_socket_open(
    alice_client, conversation, fast_engine, payload, expected
):
    communicator = socket(conversation.id, [*session_headers(alice_client), ORIGIN])
    await communicator.connect()
    await communicator.send_to(text_data=payload)
    reply = await communicator.receive_json_from(timeout=5)
    assert reply["type"] == "error"
    assert expected in reply["message"]
    await communicator.send_json_to({"type": "cancel"})  # still open: no error for a no-op cancel
    assert await communicator.receive_nothing(0.1)
    await communicator.disconnect()
    assert await Message.objects.filter(conversation=conversation).acount() == 0


async def test_bob_is_refused_on_alices_conversation(bob_client, conversation, fast_engine):
    communicator = socket(conversation.id, [*session_headers(bob_client), ORIGIN])
    connected, code = await communicator.connect()
    assert not connected
    assert code == 4403


async def test_anonymous_socket_is_refused(conversation, fast_engine):
    communicator = socket(conversation.id, [(b"host", b"localhost"), ORIGIN])
    connected, code = await communicator.connect()
    assert not connected
    assert code == 4403


async def test_foreign_origin_is_refused(alice_client, conversation, fast_engine):
    communicator = socket(conversation.id, [*session_headers(alice_client), (b"origin", b"http://evil.example")])
    connected, _ = await communicator.connect()
    assert not connected


async def test_second_generate_while_streaming_is_refused(alice_client, conversation, stream_store):
    from inference.generators import SyntheticGenerator
    from tests.support.engines import install_engine

    engine = await database_sync_to_async(install_engine)(stream_store, SyntheticGenerator(20, answer_words=64))
    communicator = socket(conversation.id, [*session_headers(alice_client), ORIGIN])
    await communicator.connect()
    await communicator.send_json_to({"type": "generate", "prompt": "One"})
    await communicator.receive_json_from(timeout=5)
    await communicator.send_json_to({"type": "generate", "prompt": "Two"})
    replies = [await communicator.receive_json_from(timeout=5) for _ in range(3)]
    assert any(r["type"] == "error" and "still being generated" in r["message"] for r in replies)
    await communicator.send_json_to({"type": "cancel"})
    await receive_until_terminal(communicator)
    await communicator.disconnect()
    engine.stop(5)
    assert await Message.objects.filter(conversation=conversation, role="user").acount() == 1


async def test_quota_refusal_is_an_error_message(alice, alice_client, conversation, fast_engine):
    from accounts.models import Account, UsageRecord
    from accounts.services import account_for

    account = await database_sync_to_async(account_for)(alice)
    await Account.objects.filter(pk=account.pk).aupdate(tokens_per_day=0)
    communicator = socket(conversation.id, [*session_headers(alice_client), ORIGIN])
    await communicator.connect()
    await communicator.send_json_to({"type": "generate", "prompt": "Hi"})
    reply = await communicator.receive_json_from(timeout=5)
    await communicator.disconnect()
    assert reply["type"] == "error"
    assert reply["code"] == "insufficient_quota"
    assert not await UsageRecord.objects.filter(user=alice).aexists()


async def test_socket_generations_are_recorded_as_ws(alice, alice_client, conversation, fast_engine):
    from accounts.models import UsageRecord

    communicator = socket(conversation.id, [*session_headers(alice_client), ORIGIN])
    await communicator.connect()
    await communicator.send_json_to({"type": "generate", "prompt": "Hi"})
    started = await communicator.receive_json_from(timeout=5)
    await receive_until_terminal(communicator)
    await communicator.disconnect()
    record = await UsageRecord.objects.aget(stream_id=started["stream_id"])
    assert record.channel == "ws"
