"""Model fallbacks: a model that cannot take a request before its first token (no endpoint
up, its queue full, a prompt beyond its context) hands it to its fallbacks, in the admin's
order, those the caller may use; the answer and the ledger name the model that served it."""

from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.urls import reverse

from accounts.models import UsageRecord
from accounts.services import account_for, api_key_create
from audit.models import AuditRecord
from generation import services
from generation.backends import router, runtime
from generation.models import Conversation, Message, ModelFallback
from inference.engine import EngineOverloaded, Job
from inference.generators import GenerationParams, SyntheticGenerator
from tests.generation.test_model_access import DEFAULT, OTHER, only
from tests.support.api_client import assert_error, get, post
from tests.support.engines import install_engine, wait_until
from tests.support.livesite import free_port
from tests.support.sockets import ORIGIN, socket
from tests.support.streams import session_headers

pytestmark = pytest.mark.django_db(transaction=True)

REMOTE = "remote"  # on a model server that is down
REMOTE_TOO = "remote-too"  # on another one, down as well
SMALL = "small"  # on a model server that holds 8 tokens
MESSAGES = [{"role": "user", "content": "Hello"}]
LONG_MESSAGES = [{"role": "user", "content": "word " * 200}]


def dead_endpoint(model: str, **fields: object) -> dict[str, object]:
    """A model server on a port that nothing listens on."""
    return {"model": model, "base_url": f"http://127.0.0.1:{free_port()}/v1", "upstream_model": "m", **fields}


def fallbacks(*chain: tuple[str, str]) -> None:
    for position, (model, fallback) in enumerate(chain):
        ModelFallback.objects.create(model=model, fallback=fallback, position=position)


@pytest.fixture
def local_models(settings, stream_store):
    """The chat model and the synthetic model, both quick engines of this process."""
    settings.CHAT_ENABLE_SYNTHETIC = True
    other = install_engine(stream_store, SyntheticGenerator(tokens_per_s=1000, answer_words=4))
    runtime.current().engines[OTHER] = other  # install_engine files it under CHAT_MODEL
    default = install_engine(stream_store, SyntheticGenerator(tokens_per_s=1000, answer_words=4))
    yield
    for engine in (default, other):
        engine.stop(timeout=10)


@pytest.fixture
def dead_upstreams(settings, local_models):
    """Two model servers' models whose servers are down, as their health checks found."""
    settings.CHAT_UPSTREAMS = [dead_endpoint(REMOTE), dead_endpoint(REMOTE_TOO), dead_endpoint(SMALL, context_length=8)]
    upstream = router.backend().upstream
    upstream.refresh(force=True)
    upstream.pool._started_loop()  # as the first submit does: the health checks begin
    wait_until(lambda: {s["state"] for s in upstream.pool.snapshots()} == {"down"}, timeout=10)
    yield
    upstream.pool.shut_down(1)


@pytest.fixture
def busy_default(settings, stream_store):
    """The chat model on an engine that runs one answer and queues none, busy with one;
    the synthetic model quick and idle."""
    settings.CHAT_ENABLE_SYNTHETIC = True
    other = install_engine(stream_store, SyntheticGenerator(tokens_per_s=1000, answer_words=4))
    runtime.current().engines[OTHER] = other
    default = install_engine(stream_store, SyntheticGenerator(tokens_per_s=20), max_concurrent=1, max_queue=0)
    default.submit(Job("busy", "Hi", GenerationParams(max_tokens=2000)))
    wait_until(lambda: default.active == 1)
    yield
    stream_store.cancel("busy")
    for engine in (default, other):
        engine.stop(timeout=10)


@pytest.fixture
def alice_key(alice) -> str:
    return api_key_create(user=alice, name="test")[1]


def test_a_dead_upstreams_model_is_served_by_its_fallback_named_in_the_answer_and_ledger(alice_key, dead_upstreams):
    fallbacks((REMOTE, OTHER))

    response = post("/v1/chat/completions", {"model": REMOTE, "messages": MESSAGES, "max_tokens": 8}, alice_key)

    assert response.status_code == 200, response.content
    answer = response.json()
    assert answer["model"] == OTHER
    assert answer["choices"][0]["message"]["content"]
    record = UsageRecord.objects.get()
    assert record.model == OTHER
    assert answer["id"] == f"chatcmpl-{record.stream_id}"


def test_a_streamed_answer_names_its_fallback_in_every_chunk(alice_key, dead_upstreams):
    fallbacks((REMOTE, OTHER))

    body = {"model": REMOTE, "messages": MESSAGES, "max_tokens": 8, "stream": True}
    response = post("/v1/chat/completions", body, alice_key)

    assert response.status_code == 200
    lines = b"".join(response).decode().splitlines()
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: {")]
    assert chunks
    assert {chunk["model"] for chunk in chunks} == {OTHER}


def test_a_response_names_its_fallback_and_reads_back_so(alice_key, dead_upstreams):
    fallbacks((REMOTE, OTHER))

    response = post("/v1/responses", {"model": REMOTE, "input": "Hello", "max_output_tokens": 8}, alice_key)

    assert response.status_code == 200, response.content
    assert response.json()["model"] == OTHER
    assert get(f"/v1/responses/{response.json()['id']}", alice_key).json()["model"] == OTHER


def test_an_over_long_prompt_is_served_by_a_fallback_with_a_longer_context(alice_key, dead_upstreams):
    fallbacks((SMALL, DEFAULT))

    response = post("/v1/chat/completions", {"model": SMALL, "messages": LONG_MESSAGES, "max_tokens": 8}, alice_key)

    assert response.status_code == 200, response.content
    assert response.json()["model"] == DEFAULT
    assert UsageRecord.objects.get().model == DEFAULT


def test_an_over_long_prompt_without_a_fallback_is_refused_as_before(alice_key, dead_upstreams):
    response = post("/v1/chat/completions", {"model": SMALL, "messages": LONG_MESSAGES, "max_tokens": 8}, alice_key)

    assert_error(response, 400, "context_length_exceeded", "messages")
    assert not UsageRecord.objects.exists()


def test_a_dead_upstream_without_fallbacks_is_refused_as_before(alice_key, dead_upstreams):
    response = post("/v1/chat/completions", {"model": REMOTE, "messages": MESSAGES, "max_tokens": 8}, alice_key)

    assert_error(response, 503, "server_overloaded")
    assert not UsageRecord.objects.exists()


def test_a_fallback_the_caller_may_not_use_is_skipped_and_the_models_refusal_stands(alice, alice_key, dead_upstreams):
    fallbacks((REMOTE, OTHER))
    only(alice, REMOTE)

    response = post("/v1/chat/completions", {"model": REMOTE, "messages": MESSAGES, "max_tokens": 8}, alice_key)

    assert_error(response, 503, "server_overloaded")
    assert not UsageRecord.objects.exists()


def test_the_next_fallback_serves_when_the_first_cannot_and_the_request_counts_once(alice, alice_key, dead_upstreams):
    fallbacks((REMOTE, REMOTE_TOO), (REMOTE, OTHER))

    response = post("/v1/chat/completions", {"model": REMOTE, "messages": MESSAGES, "max_tokens": 8}, alice_key)

    assert response.json()["model"] == OTHER
    used = get("/v1/usage", alice_key).json()["requests"]["used"]
    assert used == 1  # three models tried, one request
    limit = account_for(alice).limits.requests_per_minute
    assert int(response["x-ratelimit-remaining-requests"]) == limit - 1


def test_a_chain_that_comes_back_to_a_model_never_loops(alice, alice_key, dead_upstreams):
    fallbacks((REMOTE, REMOTE_TOO), (REMOTE_TOO, REMOTE))

    chain = services.model_fallbacks_for(model=REMOTE, account=account_for(alice))
    response = post("/v1/chat/completions", {"model": REMOTE, "messages": MESSAGES, "max_tokens": 8}, alice_key)

    assert chain == [REMOTE_TOO]
    assert_error(response, 503, "server_overloaded")


def test_a_fallbacks_own_fallbacks_follow_its_models_in_order_each_once(alice, dead_upstreams):
    fallbacks((REMOTE, REMOTE_TOO), (REMOTE, SMALL), (REMOTE_TOO, REMOTE), (REMOTE_TOO, OTHER), (SMALL, REMOTE_TOO))

    assert services.model_fallbacks_for(model=REMOTE, account=account_for(alice)) == [REMOTE_TOO, SMALL, OTHER]


def test_a_full_queue_hands_an_answer_to_the_fallback_which_the_message_names(alice, busy_default):
    fallbacks((DEFAULT, OTHER))
    conversation = Conversation.objects.create(user=alice, model=DEFAULT)

    _, answer = services.message_send(conversation=conversation, prompt="Hello")

    assert answer.model == OTHER
    assert Message.objects.get(pk=answer.pk).model == OTHER
    assert UsageRecord.objects.get(stream_id=answer.stream_id).model == OTHER
    conversation.refresh_from_db()
    assert conversation.model == DEFAULT  # the conversation keeps its choice


def test_a_full_queue_without_fallbacks_refuses_as_before_and_keeps_nothing(alice, busy_default):
    conversation = Conversation.objects.create(user=alice, model=DEFAULT)

    with pytest.raises(EngineOverloaded):
        services.message_send(conversation=conversation, prompt="Hello")

    assert not conversation.messages.exists()
    assert not UsageRecord.objects.exists()


def test_a_full_queue_on_the_api_is_served_by_the_fallback(alice_key, busy_default):
    fallbacks((DEFAULT, OTHER))

    response = post("/v1/chat/completions", {"model": DEFAULT, "messages": MESSAGES, "max_tokens": 8}, alice_key)

    assert response.status_code == 200, response.content
    assert response.json()["model"] == OTHER
    assert UsageRecord.objects.get().model == OTHER


async def test_the_websocket_answer_of_a_full_queue_comes_from_the_fallback(alice, alice_client, busy_default):
    await ModelFallback.objects.acreate(model=DEFAULT, fallback=OTHER)
    conversation = await Conversation.objects.acreate(user=alice, model=DEFAULT)
    communicator: WebsocketCommunicator = socket(conversation.id, [*session_headers(alice_client), ORIGIN])
    connected, _ = await communicator.connect()
    assert connected

    await communicator.send_json_to({"type": "generate", "prompt": "Hello"})
    started = await communicator.receive_json_from(timeout=5)
    received = []
    while not received or received[-1]["type"] not in ("done", "error"):
        received.append(await communicator.receive_json_from(timeout=10))
    await communicator.disconnect()

    assert started["type"] == "started"
    assert received[-1]["type"] == "done"
    answer = await Message.objects.aget(pk=started["message_id"])
    assert answer.model == OTHER
    assert answer.status == Message.Status.COMPLETE
    assert await database_sync_to_async(lambda: UsageRecord.objects.get().model)() == OTHER


def test_fallbacks_are_set_in_the_admin_never_a_model_of_its_own_and_edits_are_audited(admin_client):
    add = reverse("admin:generation_modelfallback_add")
    itself = admin_client.post(add, {"model": REMOTE, "fallback": REMOTE, "position": 0})
    added = admin_client.post(add, {"model": REMOTE, "fallback": OTHER, "position": 0})

    assert "A model cannot be its own fallback." in itself.content.decode()
    assert added.status_code == 302
    fallback = ModelFallback.objects.get()
    assert (fallback.model, fallback.fallback) == (REMOTE, OTHER)
    record = AuditRecord.objects.get(target=f"generation.modelfallback:{fallback.pk}")
    assert record.changes["fallback"] == [None, OTHER]
