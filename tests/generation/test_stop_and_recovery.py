"""Stop, the disconnect policy, and answers whose producer died."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from channels.testing import ApplicationCommunicator
from django.core.asgi import get_asgi_application
from django.urls import reverse

from accounts.models import UsageRecord
from accounts.services import api_key_create
from api import endpoint as api_endpoint
from generation import connection_limits, services
from generation.backends import reaping, runtime
from generation.models import Conversation, Message
from tests.support.engines import wait_for_terminal, wait_until
from tests.support.streams import get_stream, parse_sse, session_headers

pytestmark = pytest.mark.django_db(transaction=True)

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def slow_engine(stream_store):
    from inference.generators import SyntheticGenerator
    from tests.support.engines import install_engine

    engine = install_engine(stream_store, SyntheticGenerator(tokens_per_s=20, answer_words=64))
    yield engine
    engine.stop(timeout=10)


def streaming_answer(user) -> Message:
    conversation = services.conversation_create(user=user)
    return services.message_send(conversation=conversation, prompt="Tell me everything")[1]


def test_stop_saves_exactly_the_streamed_text_marked_stopped(alice, alice_client, slow_engine):
    answer = streaming_answer(alice)
    wait_until(lambda: len(slow_engine.store.events(answer.stream_id)) >= 3)

    response = alice_client.post(reverse("generation:message_stop", args=[answer.pk]), **HTMX)

    assert response.status_code == 204
    events = wait_for_terminal(slow_engine.store, answer.stream_id)
    answer.refresh_from_db()
    assert answer.status == "stopped"
    assert answer.finish_reason == "cancelled"
    assert answer.content == "".join(e.data["delta"] for e in events if e.type == "token")
    assert 3 <= answer.completion_tokens < 64
    page = alice_client.get(answer.conversation.get_absolute_url()).content.decode()
    assert 'data-status="stopped"' in page
    assert answer.content in page


def test_stop_button_is_shown_only_while_streaming(alice, alice_client, slow_engine):
    answer = streaming_answer(alice)
    page = alice_client.get(answer.conversation.get_absolute_url()).content.decode()
    assert ">Stop</button>" in page
    alice_client.post(reverse("generation:message_stop", args=[answer.pk]), **HTMX)
    wait_for_terminal(slow_engine.store, answer.stream_id)
    assert ">Stop</button>" not in alice_client.get(answer.conversation.get_absolute_url()).content.decode()


def test_stop_without_javascript_redirects_back(alice, alice_client, slow_engine):
    answer = streaming_answer(alice)
    response = alice_client.post(reverse("generation:message_stop", args=[answer.pk]))
    assert response.status_code == 302
    assert response["Location"] == answer.conversation.get_absolute_url()
    assert slow_engine.store.is_cancelled(answer.stream_id)


def test_bob_cannot_stop_alices_answer(alice, bob_client, slow_engine):
    answer = streaming_answer(alice)
    assert bob_client.post(reverse("generation:message_stop", args=[answer.pk]), **HTMX).status_code == 404
    assert not slow_engine.store.is_cancelled(answer.stream_id)
    slow_engine.cancel(answer.stream_id)


def test_stop_needs_post_and_a_login(alice, client, alice_client, slow_engine):
    answer = streaming_answer(alice)
    url = reverse("generation:message_stop", args=[answer.pk])
    assert alice_client.get(url).status_code == 405
    assert client.post(url).status_code == 302
    assert alice_client.post(reverse("generation:message_stop", args=[999999])).status_code == 404
    slow_engine.cancel(answer.stream_id)


def test_generation_goes_on_and_completes_when_the_browser_leaves(alice, slow_engine, settings):
    answer = streaming_answer(alice)
    headers = _cookie_for(alice)

    async def read_a_little_then_leave() -> None:
        application = get_asgi_application()
        scope = {"type": "http", "method": "GET", "path": answer.get_stream_url(), "query_string": b""}
        communicator = ApplicationCommunicator(application, {**scope, "headers": headers})
        await communicator.send_input({"type": "http.request", "body": b""})
        assert (await communicator.receive_output(5))["status"] == 200
        await communicator.receive_output(5)  # some body
        await communicator.send_input({"type": "http.disconnect"})
        await communicator.wait(5)

    asyncio.run(read_a_little_then_leave())
    assert not slow_engine.store.is_cancelled(answer.stream_id)
    wait_for_terminal(slow_engine.store, answer.stream_id, timeout=10)
    answer.refresh_from_db()
    assert answer.status == "complete"
    assert len(answer.content.split()) == 64


async def api_stream_requested(key: str) -> ApplicationCommunicator:
    """A streamed chat completion's request, sent whole to the ASGI application."""
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "query_string": b"",
        "headers": [
            (b"host", b"localhost"),
            (b"authorization", f"Bearer {key}".encode()),
            (b"content-type", b"application/json"),
        ],
    }
    body = b'{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Hi"}], "stream": true}'
    communicator = ApplicationCommunicator(get_asgi_application(), scope)
    await communicator.send_input({"type": "http.request", "body": body})
    return communicator


def test_an_api_stream_cancels_its_generation_when_the_client_disconnects(alice, slow_engine):
    key = api_key_create(user=alice, name="test")[1]

    async def read_then_disconnect() -> None:
        communicator = await api_stream_requested(key)
        assert (await communicator.receive_output(5))["status"] == 200
        await communicator.receive_output(5)
        await communicator.send_input({"type": "http.disconnect"})
        await communicator.wait(5)

    asyncio.run(read_then_disconnect())
    [record] = UsageRecord.objects.filter(user=alice)
    events = wait_for_terminal(slow_engine.store, record.stream_id, timeout=5)
    assert events[-1].data["status"] == "stopped"


def test_an_api_stream_whose_client_leaves_during_admission_generates_nothing(alice, slow_engine, monkeypatch):
    """Django cancels the view when the client disconnects, but not the admission's thread:
    the generation that thread starts is cancelled once it has, and the stream place freed."""
    key = api_key_create(user=alice, name="test")[1]
    admitting = threading.Event()

    def slow_start(**kwargs):
        admitting.set()
        time.sleep(0.5)  # the client leaves meanwhile
        return services.generation_start(**kwargs)

    monkeypatch.setattr(api_endpoint, "generation_start", slow_start)

    async def send_then_disconnect() -> list:
        communicator = await api_stream_requested(key)
        await asyncio.to_thread(admitting.wait, 5)
        await communicator.send_input({"type": "http.disconnect"})
        await communicator.wait(5)
        # The server's loop runs on, as in a real server, until the generation has ended.
        await asyncio.to_thread(wait_until, lambda: UsageRecord.objects.filter(user=alice).exists(), 5)
        record = await UsageRecord.objects.aget(user=alice)
        return await asyncio.to_thread(wait_for_terminal, slow_engine.store, record.stream_id, 10)

    events = asyncio.run(send_then_disconnect())
    assert events[-1].data["status"] == "stopped"
    assert connection_limits.streams.open_for(alice.pk) == 0


def test_answers_of_a_dead_process_become_interrupted_keeping_their_text(alice, slow_engine):
    conversation = Conversation.objects.create(user=alice, model="m")
    orphan = conversation.messages.create(
        role="assistant", status="streaming", stream_id="dead1", producer="host:123:gone", content="So far"
    )
    live = streaming_answer(alice)

    assert reaping.messages_settle_orphans() == 1

    orphan.refresh_from_db()
    assert orphan.status == "interrupted"
    assert orphan.content == "So far"
    live.refresh_from_db()
    assert live.status == "streaming"
    slow_engine.cancel(live.stream_id)


def test_settling_ends_the_orphans_stream_for_its_readers(alice, stream_store):
    conversation = Conversation.objects.create(user=alice, model="m")
    orphan = conversation.messages.create(role="assistant", status="streaming", stream_id="dead2", producer="gone")
    stream_store.create("dead2")
    stream_store.append("dead2", "token", {"delta": "Half"})

    reaping.message_mark_interrupted(orphan)

    events = stream_store.events("dead2")
    assert [e.type for e in events] == ["token", "error"]
    assert events[-1].data["status"] == "interrupted"


async def test_reader_of_a_stream_whose_producer_stopped_beating_gets_the_interrupted_answer(
    alice, alice_client, stream_store, monkeypatch
):
    monkeypatch.setattr("infrastructure.sse.HEARTBEAT_S", 0.05)
    conversation = await Conversation.objects.acreate(user=alice, model="m")
    orphan = await conversation.messages.acreate(
        role="assistant", status="streaming", stream_id="dead3", producer="gone", content="Partial"
    )
    stream_store.create("dead3")

    response = await get_stream(orphan.get_stream_url(), session_headers(alice_client), timeout=5)

    events = parse_sse(response["body"])
    assert [e["event"] for e in events] == ["done"]
    assert 'data-status="interrupted"' in events[0]["data"]


def _cookie_for(user) -> list[tuple[bytes, bytes]]:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return session_headers(client)


def test_runtime_producer_is_unique_per_process():
    assert runtime.PRODUCER.count(":") == 2


def test_usage_records_of_a_dead_process_stop_counting_as_running_streams(alice, stream_store):
    UsageRecord.objects.create(user=alice, channel="api", model="m", stream_id="deadapi", producer="gone")
    stream_store.create("deadapi")

    reaping.messages_settle_orphans()

    record = UsageRecord.objects.get(stream_id="deadapi")
    assert record.status == "interrupted"
    assert record.reserved_tokens == 0
    assert stream_store.events("deadapi")[-1].type == "error"
