"""The OpenAI-compatible API through Django's test client (the openai client runs in test_api_live.py)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest
from asgiref.sync import sync_to_async
from django.core.asgi import get_asgi_application

from accounts.models import Account, UsageRecord
from accounts.services import account_for, api_key_create
from api.views import Completion, completion_events
from inference.engine import EngineOverloaded
from inference.generators import SYNTHETIC_TEXT, SyntheticGenerator
from inference.streams import StreamEvent
from tests.support.api_client import CHAT, MODEL, RATE_HEADERS, assert_error, get, post, sse
from tests.support.engines import install_engine, wait_for_terminal

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def alice_key(alice) -> str:
    return api_key_create(user=alice, name="test")[1]


@pytest.fixture
def bob_key(bob) -> str:
    return api_key_create(user=bob, name="test")[1]


def test_models_lists_the_available_models(alice_key, fast_engine):
    response = get("/v1/models", alice_key)
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert body["data"][0] == {
        "id": MODEL,
        "object": "model",
        "created": 0,
        "owned_by": "chatsite",
        "kind": "chat",
    }
    assert all(response.has_header(name) for name in RATE_HEADERS)
    assert response["X-Request-Id"]


def test_non_streaming_chat_completion(alice, alice_key, fast_engine):
    response = post("/v1/chat/completions", {**CHAT, "max_tokens": 5}, alice_key)

    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == " ".join(SYNTHETIC_TEXT.split()[:5])
    assert choice["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6}
    record = UsageRecord.objects.get(user=alice)
    assert record.channel == "api"
    assert record.completion_tokens == 5
    assert record.status == "complete"
    assert record.api_key.name == "test"


def test_streaming_chat_completion_follows_the_contract(alice_key, fast_engine):
    response = post(
        "/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"include_usage": True}}, alice_key
    )

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/event-stream")
    assert response["Cache-Control"] == "no-cache"
    assert response["X-Accel-Buffering"] == "no"
    assert response["X-Request-Id"]
    assert all(response.has_header(name) for name in RATE_HEADERS)
    events = sse(response)
    assert events[-1] == (None, "[DONE]")
    chunks = [(event_id, json.loads(data)) for event_id, data in events[:-1]]
    ids = [int(event_id) for event_id, _ in chunks]
    assert ids == sorted(ids)
    assert ids[0] == 0
    first = chunks[0][1]
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"]["role"] == "assistant"
    contents = [c["choices"][0]["delta"].get("content", "") for _, c in chunks if c["choices"]]
    assert "".join(contents) == " ".join(SYNTHETIC_TEXT.split()[:12])
    finish = [c for _, c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finish) == 1
    assert finish[0]["choices"][0]["finish_reason"] == "stop"
    usage = chunks[-1][1]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 12
    assert len({c["id"] for _, c in chunks}) == 1


def test_legacy_completion_streams_text_chunks(alice_key, fast_engine):
    response = post("/v1/completions", {"model": MODEL, "prompt": "Once upon a time", "stream": True}, alice_key)
    events = sse(response)
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert chunks[0]["object"] == "text_completion"
    assert chunks[0]["id"].startswith("cmpl-")
    assert "".join(c["choices"][0]["text"] for c in chunks) == " ".join(SYNTHETIC_TEXT.split()[:12])
    whole = post("/v1/completions", {"model": MODEL, "prompt": ["Once"], "max_tokens": 3}, alice_key).json()
    assert whole["choices"][0]["text"] == " ".join(SYNTHETIC_TEXT.split()[:3])


def test_stop_sequence_cuts_the_answer_before_it(alice_key, fast_engine):
    body = post("/v1/chat/completions", {**CHAT, "stop": [" at", "zzz"]}, alice_key).json()
    assert body["choices"][0]["message"]["content"] == "Streaming tokens one"
    assert body["choices"][0]["finish_reason"] == "stop"


def test_x_api_key_header_works_too(alice_key, fast_engine):
    assert get("/v1/models", None, HTTP_X_API_KEY=alice_key).status_code == 200


@pytest.mark.parametrize("header", [{}, {"HTTP_AUTHORIZATION": "Bearer cs-nope"}, {"HTTP_AUTHORIZATION": "Basic x"}])
def test_missing_or_wrong_key_is_401(fast_engine, header):
    response = get("/v1/models", None, **header)
    assert_error(response, 401, "invalid_api_key")
    assert not response.has_header("x-ratelimit-limit-requests")


def test_revoked_key_is_401(alice, fast_engine):
    key, plain = api_key_create(user=alice, name="old")
    key.revoke()
    assert_error(get("/v1/models", plain), 401, "invalid_api_key")


def test_unknown_model_is_404(alice_key, fast_engine):
    assert_error(post("/v1/chat/completions", {**CHAT, "model": "gpt-9"}, alice_key), 404, "model_not_found", "model")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[" * 100_000, None),  # deeper than any JSON parser goes
        ([1, 2], None),
        ({"model": MODEL}, "messages"),
        ({**CHAT, "messages": []}, "messages"),
        ({**CHAT, "messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({**CHAT, "messages": [{"role": "user"}]}, "messages.0.content"),
        (
            {**CHAT, "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": None}]},
            "messages.1.content",
        ),
        ({**CHAT, "messages": [{"role": "system"}, {"role": "user", "content": "Hi"}]}, "messages.0.content"),
        ({**CHAT, "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant"}]}, "messages.1.content"),
        ({**CHAT, "temperature": "hot"}, "temperature"),
        ({**CHAT, "temperature": 3}, "temperature"),
        ({**CHAT, "top_p": 0}, "top_p"),
        ({**CHAT, "max_tokens": 0}, "max_tokens"),
        ({**CHAT, "max_tokens": "ten"}, "max_tokens"),
        ({**CHAT, "n": 2}, "n"),
        ({**CHAT, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({**CHAT, "stream": "yes"}, "stream"),
        ({**CHAT, "frequency_penalty": 0.5}, "frequency_penalty"),
        ({**CHAT, "stream_options": {"include_usage": True, "colour": "red"}}, "stream_options.colour"),
    ],
)
def test_malformed_bodies_are_400_and_start_nothing(alice, alice_key, fast_engine, body, param):
    error = assert_error(post("/v1/chat/completions", body, alice_key), 400, None)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert not UsageRecord.objects.filter(user=alice).exists()


def test_oversized_body_is_413(alice_key, fast_engine, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = {**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]}
    error = assert_error(post("/v1/chat/completions", body, alice_key), 413, "request_too_large")
    assert error["message"] == "The request body is larger than the 1000 bytes allowed."


def test_prompt_longer_than_the_context_is_context_length_exceeded(alice_key, fast_engine, monkeypatch):
    monkeypatch.setattr(fast_engine.generator, "context_length", 10)
    body = {**CHAT, "messages": [{"role": "user", "content": "word " * 20}]}
    assert_error(post("/v1/chat/completions", body, alice_key), 400, "context_length_exceeded", "messages")


def test_max_tokens_above_the_plan_is_400(alice, alice_key, fast_engine):
    limit = account_for(alice).limits.max_tokens_per_request
    assert_error(post("/v1/chat/completions", {**CHAT, "max_tokens": limit + 1}, alice_key), 400, None, "max_tokens")
    assert (
        post("/v1/chat/completions", {**CHAT, "max_completion_tokens": 2}, alice_key).json()["usage"][
            "completion_tokens"
        ]
        == 2
    )


def test_requests_per_minute_limit_is_429_with_retry_after(alice, alice_key, fast_engine):
    Account.objects.filter(pk=account_for(alice).pk).update(requests_per_minute=2)
    for _ in range(2):
        assert post("/v1/chat/completions", {**CHAT, "max_tokens": 1}, alice_key).status_code == 200
    response = post("/v1/chat/completions", {**CHAT, "max_tokens": 1}, alice_key)
    assert_error(response, 429, "rate_limit_exceeded")
    assert 0 < int(response["Retry-After"]) <= 60
    assert response["x-ratelimit-limit-requests"] == "2"
    assert response["x-ratelimit-remaining-requests"] == "0"


def test_daily_tokens_cap_max_tokens_then_refuse(alice, alice_key, fast_engine):
    Account.objects.filter(pk=account_for(alice).pk).update(tokens_per_day=6)
    capped = post("/v1/chat/completions", CHAT, alice_key).json()
    # The prompt's token comes out of the day's 6 first; the answer gets the rest.
    assert capped["usage"] == {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6}
    assert capped["choices"][0]["finish_reason"] == "length"
    response = post("/v1/chat/completions", CHAT, alice_key)
    assert_error(response, 429, "insufficient_quota")
    assert response.json()["error"]["type"] == "insufficient_quota"
    assert int(response["Retry-After"]) > 0
    assert response["x-ratelimit-remaining-tokens"] == "0"


def test_concurrent_streams_limit_is_429(alice, alice_key, stream_store):
    from inference.generators import SyntheticGenerator
    from tests.support.engines import install_engine

    engine = install_engine(stream_store, SyntheticGenerator(tokens_per_s=20))
    Account.objects.filter(pk=account_for(alice).pk).update(max_concurrent_streams=1)
    # A stream that is started but not read: its generation runs on.
    post("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"resumable": True}}, alice_key)
    first = UsageRecord.objects.get(user=alice)
    assert_error(post("/v1/chat/completions", CHAT, alice_key), 429, "too_many_concurrent_streams")
    stream_store.cancel(first.stream_id)
    wait_for_terminal(stream_store, first.stream_id)
    engine.stop(5)


def test_full_queue_is_503_with_retry_after(alice_key, fast_engine, monkeypatch):
    def refuse(job):
        raise EngineOverloaded("full")

    monkeypatch.setattr(fast_engine, "submit", refuse)
    response = post("/v1/chat/completions", CHAT, alice_key)
    assert_error(response, 503, "server_overloaded")
    assert response["Retry-After"]


@pytest.fixture
def one_at_a_time(stream_store):
    """An engine that runs one generation at a time: the next one waits in the queue."""
    engine = install_engine(stream_store, SyntheticGenerator(tokens_per_s=200), max_concurrent=1)
    yield engine
    engine.stop(10)


def start_bobs_stream(bob_key: str, max_tokens: int) -> str:
    """Bob's resumable stream, started and not read: it generates on. Returns its stream id."""
    body = {**CHAT, "stream": True, "max_tokens": max_tokens, "stream_options": {"resumable": True}}
    assert post("/v1/chat/completions", body, bob_key).status_code == 200
    return UsageRecord.objects.get(user__username="bob").stream_id


def test_a_waiting_stream_tells_its_place_in_comment_lines_only(alice_key, bob_key, one_at_a_time):
    bobs = start_bobs_stream(bob_key, max_tokens=1000)
    response = post("/v1/chat/completions", {**CHAT, "stream": True, "max_tokens": 4}, alice_key)
    one_at_a_time.store.cancel(bobs)  # bob's answer stops: alice's runs

    body = b"".join(response).decode()

    lines = body.splitlines()
    assert lines[3:5] == [": queued, 0 ahead", ": running"]  # after the role chunk, before any content
    assert lines[5].startswith("id: ")  # a comment line ends no event: no blank line after it
    data = [line.removeprefix("data: ") for line in lines if line.startswith("data:")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(item) for item in data[:-1]]
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}  # nothing a client doesn't know
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == " ".join(SYNTHETIC_TEXT.split()[:4])


def cancel_once_another_waits(engine, stream_id: str) -> None:
    """Cancel a running stream, from another thread, as soon as a job waits behind it: the
    waiting one surely waited, and runs next, however slow the machine."""

    def cancel() -> None:
        deadline = time.monotonic() + 30
        while not engine.queued and time.monotonic() < deadline:
            time.sleep(0.01)
        engine.store.cancel(stream_id)

    threading.Thread(target=cancel, daemon=True).start()


def test_a_queued_non_streaming_completion_waits_and_answers(alice, alice_key, bob_key, one_at_a_time):
    cancel_once_another_waits(one_at_a_time, start_bobs_stream(bob_key, max_tokens=1000))

    response = post("/v1/chat/completions", {**CHAT, "max_tokens": 3}, alice_key)

    assert response.status_code == 200, response.content
    assert response.json()["choices"][0]["message"]["content"] == " ".join(SYNTHETIC_TEXT.split()[:3])
    events = one_at_a_time.store.events(UsageRecord.objects.get(user=alice).stream_id)
    assert [e.data for e in events if e.type == "status"] == [{"state": "queued", "ahead": 0}, {"state": "running"}]


async def test_the_openai_client_streams_a_queued_completion_without_seeing_its_status(
    alice_key, bob_key, one_at_a_time
):
    bobs = await sync_to_async(start_bobs_stream)(bob_key, max_tokens=1000)
    transport = httpx.ASGITransport(app=get_asgi_application())  # Django in this process; reads whole responses
    client = openai.AsyncOpenAI(
        base_url="http://testserver/v1", api_key=alice_key, http_client=httpx.AsyncClient(transport=transport)
    )

    cancel_once_another_waits(one_at_a_time, bobs)

    stream = await client.chat.completions.create(model=MODEL, messages=CHAT["messages"], stream=True, max_tokens=5)
    chunks = [chunk async for chunk in stream]

    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == " ".join(SYNTHETIC_TEXT.split()[:5])
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]
    record = await UsageRecord.objects.aget(user__username="alice")
    statuses = [e.type for e in one_at_a_time.store.events(record.stream_id) if e.type == "status"]
    assert statuses == ["status", "status"]  # it did wait: the client skipped both


def test_status_events_become_comments_between_chunks():
    completion = Completion(kind="text", stream_id="s", model=MODEL, created=0)
    events = [
        StreamEvent(1, "status", {"state": "queued", "ahead": 2}),
        StreamEvent(2, "status", {"state": "queued", "ahead": 1}),
        StreamEvent(3, "status", {"state": "running"}),
        StreamEvent(4, "token", {"delta": "Hi"}),
    ]
    lines = completion_events(completion, events, include_usage=False).decode().split("\n")
    assert lines[:4] == [": queued, 2 ahead", ": queued, 1 ahead", ": running", "id: 4"]
    assert json.loads(lines[4].removeprefix("data: "))["choices"][0]["text"] == "Hi"
    assert lines[5:] == ["", ""]


def test_resume_after_an_event_replays_the_rest(alice_key, fast_engine):
    whole = post("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"resumable": True}}, alice_key)
    events = sse(whole)
    completion_id = json.loads(events[0][1])["id"]
    full_text = "".join(
        json.loads(d)["choices"][0]["delta"].get("content", "") for _, d in events[:-1] if json.loads(d)["choices"]
    )

    resumed = sse(get(f"/v1/streams/{completion_id}", alice_key, HTTP_LAST_EVENT_ID="5"))
    text = "".join(
        json.loads(d)["choices"][0]["delta"].get("content", "") for _, d in resumed[:-1] if json.loads(d)["choices"]
    )
    assert full_text.endswith(text)
    assert full_text[: -len(text)] == " ".join(SYNTHETIC_TEXT.split()[:5])
    assert resumed[-1] == (None, "[DONE]")
    assert sse(get(f"/v1/streams/{completion_id}?after=5", alice_key))[:-1] == resumed[:-1]
    assert_error(get(f"/v1/streams/{completion_id}?after=x", alice_key), 400, None, "after")


def test_bob_cannot_resume_cancel_or_see_alices_stream(alice_key, bob_key, fast_engine):
    body = post("/v1/chat/completions", CHAT, alice_key).json()
    assert_error(get(f"/v1/streams/{body['id']}", bob_key), 404, "stream_not_found")
    assert_error(post(f"/v1/streams/{body['id']}/cancel", {}, bob_key), 404, "stream_not_found")
    assert_error(get("/v1/streams/chatcmpl-unknown", alice_key), 404, "stream_not_found")
    bob_usage = get("/v1/usage", bob_key).json()
    assert bob_usage["tokens"]["used"] == 0


def gone_stream(user, stream_id: str, status: str, completion_tokens: int = 0) -> str:
    """The id of a completion the ledger has and the stream store no longer does."""
    UsageRecord.objects.create(
        user=user,
        channel="api",
        model=MODEL,
        stream_id=stream_id,
        status=status,
        finish_reason="error" if status == "interrupted" else "stop",
        completion_tokens=completion_tokens,
    )
    return f"chatcmpl-{stream_id}"


def test_resuming_an_answer_the_server_stopped_says_so_with_how_far_it_got(alice, alice_key, stream_store):
    completion_id = gone_stream(alice, "crashed1", "interrupted", completion_tokens=42)

    events = sse(get(f"/v1/streams/{completion_id}", alice_key))

    assert json.loads(events[-2][1])["error"] == {
        "message": "This answer was interrupted (the server stopped) after 42 tokens; it will not be finished.",
        "type": "server_error",
        "param": None,
        "code": "generation_failed",
    }
    assert events[-1] == (None, "[DONE]")


def test_resuming_an_answer_interrupted_before_its_tokens_were_counted_says_so(alice, alice_key, stream_store):
    completion_id = gone_stream(alice, "crashed2", "interrupted")  # the reaper counts none: unknown

    events = sse(get(f"/v1/streams/{completion_id}", alice_key))

    error = json.loads(events[-2][1])["error"]
    assert error["message"] == "This answer was interrupted (the server stopped); it will not be finished."
    assert events[-1] == (None, "[DONE]")


def test_resuming_a_finished_stream_past_its_retention_says_it_has_expired(alice, alice_key, stream_store):
    completion_id = gone_stream(alice, "finished1", "complete", completion_tokens=12)

    events = sse(get(f"/v1/streams/{completion_id}", alice_key))

    error = json.loads(events[-2][1])["error"]
    assert (error["message"], error["code"]) == ("This stream has expired.", "stream_not_found")
    assert events[-1] == (None, "[DONE]")


def test_bob_learns_nothing_of_alices_interrupted_stream(alice, bob_key, stream_store):
    completion_id = gone_stream(alice, "crashed3", "interrupted", completion_tokens=42)

    alices = get(f"/v1/streams/{completion_id}", bob_key)
    unknown = get("/v1/streams/chatcmpl-crashed4", bob_key)

    assert alices.status_code == unknown.status_code == 404
    assert alices.content == unknown.content.replace(b"crashed4", b"crashed3")


def test_cancel_stops_a_running_generation(alice, alice_key, stream_store):
    from inference.generators import SyntheticGenerator
    from tests.support.engines import install_engine

    engine = install_engine(stream_store, SyntheticGenerator(tokens_per_s=20))
    post("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"resumable": True}}, alice_key)
    record = UsageRecord.objects.get(user=alice)
    response = post(f"/v1/streams/chatcmpl-{record.stream_id}/cancel", {}, alice_key)
    assert response.status_code == 200
    assert response.json()["cancelled"] is True
    done = wait_for_terminal(stream_store, record.stream_id)[-1]
    engine.stop(5)
    assert done.data["status"] == "stopped"
    record.refresh_from_db()
    assert record.status == "stopped"
    assert record.completion_tokens < 1024


def test_usage_reports_plan_used_and_remaining(alice_key, fast_engine):
    post("/v1/chat/completions", {**CHAT, "max_tokens": 4}, alice_key)
    body = get("/v1/usage", alice_key).json()
    assert body["plan"] == "default"
    assert body["tokens"]["used"] == 5
    assert body["tokens"]["remaining"] == body["tokens"]["per_day"] - 5
    assert body["requests"]["used"] == 1
    assert body["requests"]["resets_in_s"] <= 60


def test_openapi_document_and_docs_page(client):
    document = client.get("/v1/openapi.json").json()
    assert document["openapi"].startswith("3.1")
    for path in ("/models", "/chat/completions", "/completions", "/streams/{id}", "/streams/{id}/cancel", "/usage"):
        assert path in document["paths"]
    assert "ChatCompletionRequest" in document["components"]["schemas"]
    page = client.get("/v1/docs").content.decode()
    assert "POST /v1/chat/completions" in page
    assert "curl -N" in page


def test_metrics_report_generations_and_tokens(alice_key, fast_engine, client):
    post("/v1/chat/completions", {**CHAT, "max_tokens": 3}, alice_key)
    text = client.get("/metrics").content.decode()
    assert f'chatsite_active_generations{{model="{MODEL}"}} 0' in text
    assert f'chatsite_queued_generations{{model="{MODEL}"}} 0' in text
    assert f'chatsite_generated_tokens_total{{model="{MODEL}"}} 3' in text
