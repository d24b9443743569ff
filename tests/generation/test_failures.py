"""A generation that fails inside the server: every channel shows a generic message with a
reference, and only the log has the exception's text and traceback."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import OperationalError

from accounts.models import UsageRecord
from accounts.services import api_key_create, usage_finish
from generation import routing
from generation.backends import jobs
from generation.models import Conversation, Message
from inference.backend import GenerationTask
from inference.engine import GenerationResult, Job, failure_message
from inference.generators import GenerationParams, SyntheticGenerator
from inference.streams import InMemoryStreamStore
from inference.upstream import UpstreamPool, endpoint_from_json
from tests.support.api_client import CHAT, post, sse
from tests.support.engines import install_engine, wait_for_terminal
from tests.support.streams import answer_in_new_conversation, get_stream, parse_sse, session_headers
from tests.support.upstreams import ScriptedServer, event_stream

pytestmark = pytest.mark.django_db(transaction=True)

# What torch says when a kernel fails: paths and device state no client should read.
TORCH_FAILURE = "CUDA error: device-side assert triggered at /opt/build/torch/csrc/Indexing.cu:1284 (secret-7f3a)"
SECRET = "secret-7f3a"


class FailingGenerator(SyntheticGenerator):
    """The synthetic model, failing as a torch kernel might once it has written its answer."""

    def finish_reason(self, length: int) -> str:
        raise RuntimeError(TORCH_FAILURE)


@pytest.fixture
def failing_engine(stream_store):
    engine = install_engine(stream_store, FailingGenerator(tokens_per_s=500, answer_words=3))
    yield engine
    engine.stop(timeout=10)


@pytest.fixture
def alice_key(alice) -> str:
    return api_key_create(user=alice, name="test")[1]


def assert_logged_with_traceback(caplog, stream_id: str) -> None:
    failures = [r for r in caplog.records if r.exc_info and SECRET in str(r.exc_info[1])]
    assert failures, "the log has no record of the failure"
    assert any(stream_id in r.getMessage() for r in failures)
    assert "Traceback (most recent call last)" in caplog.text


def test_a_failed_completion_is_a_500_with_the_stream_as_reference(alice, alice_key, failing_engine, caplog):
    response = post("/v1/chat/completions", {**CHAT, "max_tokens": 5}, alice_key)

    assert response.status_code == 500
    stream_id = alice.usage_records.get().stream_id
    assert response.json()["error"] == {
        "message": failure_message(stream_id),
        "type": "server_error",
        "param": None,
        "code": "generation_failed",
    }
    assert SECRET not in response.content.decode()
    assert_logged_with_traceback(caplog, stream_id)


def test_a_failed_stream_ends_with_a_generic_error_event_after_its_tokens(alice, alice_key, failing_engine, caplog):
    response = post("/v1/chat/completions", {**CHAT, "stream": True}, alice_key)

    events = sse(response)
    assert events[-1] == (None, "[DONE]")
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]) == "Streaming tokens one"
    stream_id = alice.usage_records.get().stream_id
    assert chunks[-1]["error"]["message"] == failure_message(stream_id)
    assert SECRET not in "".join(data for _, data in events)
    assert_logged_with_traceback(caplog, stream_id)


async def test_the_browser_shows_the_generic_message_on_the_saved_answer(alice, alice_client, failing_engine, caplog):
    answer = await sync_to_async(answer_in_new_conversation)(alice, max_tokens=5)

    response = await get_stream(f"/chat/streams/{answer.stream_id}/", session_headers(alice_client))

    done = parse_sse(response["body"])[-1]
    assert done["event"] == "done"
    assert failure_message(answer.stream_id) in done["data"]
    assert SECRET not in response["body"].decode()
    saved = await Message.objects.aget(pk=answer.pk)
    assert saved.status == "error"
    assert saved.error == failure_message(answer.stream_id)
    assert_logged_with_traceback(caplog, answer.stream_id)


async def test_the_websocket_sends_the_generic_message(alice, alice_client, failing_engine):
    conversation = await Conversation.objects.acreate(user=alice, model="smollm2-135m-instruct")
    headers = [*session_headers(alice_client), (b"origin", b"http://localhost")]
    communicator = WebsocketCommunicator(routing.websocket_application, f"/ws/chat/{conversation.id}/", headers=headers)
    assert (await communicator.connect())[0]

    await communicator.send_json_to({"type": "generate", "prompt": "Fail, please"})
    started = await communicator.receive_json_from(timeout=5)
    received = []
    while not received or received[-1]["type"] != "error":
        received.append(await communicator.receive_json_from(timeout=10))
    await communicator.disconnect()

    assert received[-1]["message"] == failure_message(started["stream_id"])
    assert SECRET not in json.dumps(received)


async def server_error(request: web.Request) -> web.Response:
    return web.json_response({"error": {"message": TORCH_FAILURE}}, status=500)


async def error_mid_answer(request: web.Request) -> web.Response:
    chunks = [{"choices": [{"index": 0, "delta": {"content": "Hi"}}]}, {"error": {"message": TORCH_FAILURE}}]
    return event_stream(chunks, done=False)


@pytest.mark.parametrize("model_server", [server_error, error_mid_answer])
def test_a_model_servers_own_failure_reaches_the_log_not_the_stream(model_server, caplog):
    store = InMemoryStreamStore()
    pool = UpstreamPool(store, health_interval_s=60)
    with ScriptedServer(model_server) as upstream:
        endpoint = {"model": "remote", "base_url": upstream.base_url, "upstream_model": "m"}
        pool.configure([endpoint_from_json(endpoint, "e")])

        pool.submit(Job("s1", CHAT["messages"]), model="remote", prompt_tokens=1, body={"messages": CHAT["messages"]})

        error = wait_for_terminal(store, "s1", timeout=10)[-1]
        pool.shut_down(1)
    assert error.type == "error"
    assert error.data["message"] == failure_message("s1")
    assert SECRET not in json.dumps([event.data for event in store.events("s1")])
    assert any("s1" in r.getMessage() and SECRET in r.getMessage() for r in caplog.records)


def test_a_result_is_saved_although_the_connection_died_under_its_first_write(alice, monkeypatch):
    UsageRecord.objects.create(user=alice, channel="api", model="synthetic", stream_id="s1")
    writes = []

    def dies_once(**fields):
        writes.append(fields)
        if len(writes) == 1:
            raise OperationalError("terminating connection due to administrator command")
        usage_finish(**fields)

    monkeypatch.setattr(jobs, "usage_finish", dies_once)
    task = GenerationTask("s1", "synthetic", "Hi", GenerationParams(max_tokens=5))
    job = jobs.job_for(task)
    assert job.on_finish is not None

    job.on_finish(GenerationResult(text="Hi there", status="complete", finish_reason="length", completion_tokens=2))

    assert len(writes) == 2
    record = UsageRecord.objects.get(stream_id="s1")
    assert (record.status, record.completion_tokens) == ("complete", 2)
