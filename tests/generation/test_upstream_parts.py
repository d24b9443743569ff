"""The upstream backend's parts, one at a time; the real servers are in tests/test_upstream.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import pytest
from aiohttp import web
from django.core.exceptions import ImproperlyConfigured
from django.urls import reverse

from accounts.models import UsageRecord
from accounts.services import api_key_create
from api.chunks import Completion, WholeAnswer, completion_events
from generation.backends import router
from generation.checks import configured_upstreams, settings_check_or_stop
from generation.models import UpstreamEndpoint
from inference import upstream as upstream_module
from inference.backend import GenerationTask, LedgerVerdict
from inference.engine import Job
from inference.generators import GenerationParams
from inference.streams import InMemoryStreamStore, StreamEvent
from inference.upstream import (
    Circuit,
    UpstreamPool,
    endpoint_from_json,
    estimate_prompt_tokens,
    openai_tool_call_deltas,
    wire,
)
from tests.support.api_client import CHAT, assert_error, post
from tests.support.engines import wait_for_terminal, wait_until
from tests.support.upstreams import ScriptedServer, event_stream

ENDPOINT = {"model": "remote", "base_url": "http://127.0.0.1:9/v1", "upstream_model": "m"}


@pytest.fixture
def alice_key(alice) -> str:
    return api_key_create(user=alice, name="test")[1]


def test_an_upstream_from_json_needs_its_fields_and_knows_no_others():
    assert endpoint_from_json({**ENDPOINT, "max_concurrent": 2}, "env-1").max_concurrent == 2
    for wrong, says in (
        ({"model": "remote"}, "needs base_url, upstream_model"),
        ({**ENDPOINT, "colour": "red"}, "unknown upstream fields: colour"),
        ({**ENDPOINT, "base_url": "ftp://x"}, "http(s) URL"),
        ({**ENDPOINT, "max_concurrent": 0}, "at least 1"),
        ([ENDPOINT], "a JSON object"),
    ):
        with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
            endpoint_from_json(wrong, "env-1")


def test_chat_upstreams_that_is_not_a_json_list_stops_the_settings(monkeypatch):
    from chatsite.settings import env_json_list

    monkeypatch.setenv("CHAT_UPSTREAMS", "{not json")
    with pytest.raises(ImproperlyConfigured, match="CHAT_UPSTREAMS: not JSON"):
        env_json_list("CHAT_UPSTREAMS")
    monkeypatch.setenv("CHAT_UPSTREAMS", json.dumps(ENDPOINT))
    with pytest.raises(ImproperlyConfigured, match="CHAT_UPSTREAMS: a JSON list is expected"):
        env_json_list("CHAT_UPSTREAMS")


def test_a_bad_model_server_entry_fails_the_system_check_naming_the_variable(settings):
    settings.CHAT_UPSTREAMS = [{"model": "remote"}]
    with pytest.raises(ImproperlyConfigured, match="CHAT_UPSTREAMS: an upstream needs base_url"):
        settings_check_or_stop()

    settings.CHAT_UPSTREAMS = [ENDPOINT]
    settings_check_or_stop()
    assert [endpoint.name for endpoint in configured_upstreams()] == ["env-1"]


def test_a_circuit_opens_after_consecutive_failures_then_lets_one_probe_through():
    circuit = Circuit(threshold=3, open_s=0.1)
    for _ in range(2):
        circuit.failed()
    circuit.succeeded()  # a success starts the count again
    for _ in range(3):
        assert circuit.allows()
        circuit.failed()
    assert circuit.state == "open"
    assert not circuit.allows()

    time.sleep(0.12)
    assert circuit.allows()
    circuit.taken()  # the probe
    assert circuit.state == "half-open"
    assert not circuit.allows()
    circuit.failed()  # the probe failed: open again
    assert circuit.state == "open"

    time.sleep(0.12)
    circuit.taken()
    circuit.succeeded()
    assert circuit.state == "closed"
    assert circuit.allows()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tools", [{"type": "function", "function": {"name": "now", "parameters": {}}}]),
        ("response_format", {"type": "json_object"}),
        ("logprobs", True),
        ("tool_choice", "required"),
    ],
)
def test_the_in_process_models_refuse_what_only_model_servers_do_naming_the_field(
    alice, alice_key, fast_engine, field, value
):
    error = assert_error(post("/v1/chat/completions", {**CHAT, field: value}, alice_key), 400, None, field)
    assert "does not support" in error["message"]
    assert not UsageRecord.objects.filter(user=alice).exists()


@pytest.mark.django_db(transaction=True)
def test_the_in_process_models_take_those_fields_at_their_neutral_values(alice_key, fast_engine):
    neutral = {"logprobs": False, "response_format": {"type": "text"}, "tool_choice": "none", "tools": []}
    assert post("/v1/chat/completions", {**CHAT, **neutral, "max_tokens": 2}, alice_key).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_tool_round_trip_needs_a_model_that_takes_tools(alice_key, fast_engine):
    messages = [
        {"role": "user", "content": "What time is it?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
    ]
    assert_error(post("/v1/chat/completions", {**CHAT, "messages": messages}, alice_key), 400, None, "tools")


def tool_call_events() -> list[StreamEvent]:
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "now", "arguments": '{"tz":'}}
    return [
        StreamEvent(1, "tool_call", {"tool_calls": [call]}),
        StreamEvent(2, "tool_call", {"tool_calls": [{"index": 0, "function": {"arguments": '"UTC"}'}}]}),
        StreamEvent(3, "token", {"delta": "", "logprobs": [{"token": "x", "logprob": -0.5}]}),
        StreamEvent(4, "done", {"finish_reason": "tool_calls", "usage": {"prompt_tokens": 3, "completion_tokens": 2}}),
    ]


def test_tool_call_deltas_stream_as_openai_chunks_and_gather_into_one_call():
    completion = Completion(kind="chat", stream_id="s", model="remote", created=0)
    body = completion_events(completion, tool_call_events(), include_usage=False).decode()
    chunks = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]
    assert chunks[0]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "now"
    assert chunks[2]["choices"][0]["logprobs"] == {"content": [{"token": "x", "logprob": -0.5}]}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"

    answer = WholeAnswer()
    for event in tool_call_events():
        answer.take(event)
    whole = completion.whole(answer, "tool_calls", {"prompt_tokens": 3, "completion_tokens": 2})
    message = whole["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "now", "arguments": '{"tz":"UTC"}'}}
    ]


def test_tool_call_deltas_name_their_call_once_as_openai_does_whatever_the_server_repeats():
    # llama.cpp's server: id, type and name again in every delta of the same call.
    head = {"index": 0, "id": "c1", "type": "function", "function": {"name": "now", "arguments": "{"}}
    repeated = {"index": 0, "id": "c1", "type": "function", "function": {"name": "now", "arguments": "}"}}
    second = {"index": 1, "id": "c2", "type": "function", "function": {"name": "later", "arguments": ""}}
    begun: set[int] = set()

    assert openai_tool_call_deltas([head], begun) == [head]
    assert openai_tool_call_deltas([repeated, second], begun) == [{"index": 0, "function": {"arguments": "}"}}, second]
    assert begun == {0, 1}


@pytest.mark.django_db
def test_an_endpoints_api_key_is_written_in_the_admin_and_never_shown_again(admin_client):
    endpoint = UpstreamEndpoint.objects.create(**{**ENDPOINT, "api_key": "sk-secret-123"})
    url = reverse("admin:generation_upstreamendpoint_change", args=[endpoint.pk])

    page = admin_client.get(url).content.decode()
    assert "sk-secret-123" not in page

    form = {**ENDPOINT, "api_key": "", "max_concurrent": 4, "weight": 1, "connect_timeout_s": 5}
    form |= {"first_token_timeout_s": 60, "read_timeout_s": 60, "enabled": "on"}
    assert admin_client.post(url, form).status_code == 302
    endpoint.refresh_from_db()
    assert endpoint.api_key == "sk-secret-123"
    assert endpoint.max_concurrent == 4  # empty keeps the saved key
    admin_client.post(url, {**form, "clear_api_key": "on"})
    endpoint.refresh_from_db()
    assert endpoint.api_key == ""


@pytest.mark.django_db
def test_an_endpoint_with_a_tokenizer_counts_prompts_with_it_and_without_one_estimates(settings, stream_store, smollm):
    settings.CHAT_UPSTREAMS = [{**ENDPOINT, "tokenizer": "smollm2-135m-instruct"}]
    upstream = router.backend().upstream
    assert upstream.count_prompt_tokens("remote", CHAT["messages"]) == smollm.count_prompt_tokens(CHAT["messages"])

    settings.CHAT_UPSTREAMS = [ENDPOINT]
    upstream.refresh(force=True)
    assert upstream.count_prompt_tokens("remote", CHAT["messages"]) == estimate_prompt_tokens(CHAT["messages"])


def test_a_pool_serving_upstream_runs_beats_as_its_producer_so_the_reaper_spares_them():
    store = InMemoryStreamStore()
    pool = UpstreamPool(store, producer="web-1:42:abc")
    assert not store.producer_alive("web-1:42:abc")

    pool._started_loop()  # as the first submit() does

    deadline = time.monotonic() + 3
    while not store.producer_alive("web-1:42:abc") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert store.producer_alive("web-1:42:abc")


def test_a_task_started_before_its_admission_travels_without_it():
    task = GenerationTask("s", "remote", "Hi", GenerationParams(max_tokens=5), admission=LedgerVerdict())
    data = json.loads(json.dumps(task.to_json()))
    assert data["admission"] is None
    assert GenerationTask.from_json(data).params == task.params


@pytest.mark.django_db
def test_a_task_counted_at_admission_is_not_counted_again_on_its_way_to_the_server(settings, stream_store, monkeypatch):
    settings.CHAT_UPSTREAMS = [ENDPOINT]
    upstream = router.backend().upstream
    upstream.refresh(force=True)
    sent: dict[str, object] = {}
    monkeypatch.setattr(upstream.pool, "submit", lambda job, **kwargs: sent.update(kwargs))
    monkeypatch.setattr(upstream, "count_prompt_tokens", lambda *_: pytest.fail("counted a second time"))
    upstream.submit(GenerationTask("s", "remote", "Hi", GenerationParams(max_tokens=5), prompt_tokens=7))
    assert sent["prompt_tokens"] == 7


# -- the HTTP client: one kept connection, bounded lines --------------------------------


def chunk_of(text: str, finish_reason: str | None = None) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish_reason}]}


def health_checks(upstream: ScriptedServer) -> int:
    """How many times the server was asked for its models: the pool's health checks."""
    return sum(path == "/v1/models" for _, path, _ in upstream.requests)


def run_on_pool(
    upstream: ScriptedServer,
    *names: str,
    before: Callable[[str], object] = lambda name: None,
    **endpoint_fields: object,
) -> list[list[StreamEvent]]:
    """Each of `names` generated on a new pool, one after the other, to its terminal event,
    `before(name)` called before each is submitted."""
    store = InMemoryStreamStore()
    pool = UpstreamPool(store, health_interval_s=60)
    endpoint = {"model": "remote", "base_url": upstream.base_url, "upstream_model": "m", **endpoint_fields}
    pool.configure([endpoint_from_json(endpoint, "e")])
    try:
        events = []
        for name in names:
            before(name)
            pool.submit(
                Job(name, CHAT["messages"]), model="remote", prompt_tokens=1, body={"messages": CHAT["messages"]}
            )
            events.append(wait_for_terminal(store, name, timeout=10))
        return events
    finally:
        pool.shut_down(1)


def test_generations_one_after_another_go_over_one_kept_connection():
    peers: list[object] = []

    async def model_server(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        return event_stream([chunk_of("Hi"), chunk_of(" there", "stop")])

    with ScriptedServer(model_server) as upstream:
        answers = run_on_pool(upstream, "s1", "s2", "s3", "s4")

    assert [[e.data.get("delta") for e in events if e.type == "token"] for events in answers] == [["Hi", " there"]] * 4
    # Read to its end, each response gave its connection back to the pool. (Two at most: the
    # first health check may hold one while the first generation starts.)
    assert len(peers) == 4
    assert len(set(peers)) <= 2


def test_a_connection_idle_longer_than_the_keepalive_is_not_used_again(monkeypatch):
    """A server closes idle connections (llama-server and vLLM after 5 s): a request sent on
    one just as it closes is lost. The pool gives up an idle connection sooner."""
    assert wire.KEEPALIVE_S < 5
    monkeypatch.setattr(wire, "KEEPALIVE_S", 0.3)

    async def model_server(request: web.Request) -> web.Response:
        return event_stream([chunk_of("Hi", "stop")])

    def idle_before_the_last(name: str) -> None:
        if name == "s4":
            time.sleep(0.6)  # twice the keep-alive

    with ScriptedServer(model_server) as upstream:
        run_on_pool(upstream, "s1", "s2", "s3", "s4", before=idle_before_the_last)

    peers = upstream.peers  # the connection of each request, health checks' too
    assert peers[-1] not in peers[:-1]  # every kept connection had been idle too long


def test_a_pool_shut_down_stops_its_checks_its_connections_and_its_thread():
    async def model_server(request: web.Request) -> web.Response:
        return event_stream([chunk_of("Hi", "stop")])

    store = InMemoryStreamStore()
    pool = UpstreamPool(store, health_interval_s=0.05)
    with ScriptedServer(model_server) as upstream:
        pool.configure([endpoint_from_json({**ENDPOINT, "base_url": upstream.base_url}, "e")])
        pool.submit(Job("s1", CHAT["messages"]), model="remote", prompt_tokens=1, body={"messages": CHAT["messages"]})
        wait_for_terminal(store, "s1", timeout=10)
        pool.shut_down(1)
        asked = len(upstream.requests)
        time.sleep(0.2)  # four health intervals

    assert len(upstream.requests) == asked  # no more checks
    assert pool._client is not None
    assert pool._client.closed
    assert pool._thread is not None
    assert not pool._thread.is_alive()
    pool.shut_down(1)  # again: nothing left to do


def test_an_endpoints_api_key_goes_with_its_generations_and_health_checks_and_nowhere_else():
    async def model_server(request: web.Request) -> web.Response:
        return event_stream([chunk_of("Hi", "stop")])

    with ScriptedServer(model_server) as upstream:
        run_on_pool(upstream, "s1", api_key="sk-upstream")
    with ScriptedServer(model_server) as keyless:
        run_on_pool(keyless, "s2")

    asked = {(method, path): headers.get("Authorization") for method, path, headers in upstream.requests}
    assert asked == {
        ("GET", "/v1/models"): "Bearer sk-upstream",
        ("POST", "/v1/chat/completions"): "Bearer sk-upstream",
    }
    assert keyless.requests
    assert all("Authorization" not in headers for _, _, headers in keyless.requests)


def test_requests_go_through_the_proxy_the_environment_names_unless_no_proxy_spares_the_server(monkeypatch):
    async def model_server(request: web.Request) -> web.Response:
        return event_stream([chunk_of("Hi", "stop")])

    with ScriptedServer(model_server) as proxy:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
        # A name nothing resolves: only the proxy can reach it.
        [events] = run_on_pool(proxy, "s1", base_url="http://model-server.invalid/v1")
    with ScriptedServer(model_server) as direct:
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        run_on_pool(direct, "s2")

    assert events[-1].type == "done"
    assert ("POST", "/v1/chat/completions", "model-server.invalid") in {
        (method, path, headers["Host"]) for method, path, headers in proxy.requests
    }
    assert direct.requests


def test_a_netrc_entry_for_the_model_server_neither_replaces_nor_clashes_with_its_api_key(monkeypatch, tmp_path):
    # aiohttp's trust_env would send the entry as basic auth, refusing it beside the key.
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))

    async def model_server(request: web.Request) -> web.Response:
        return event_stream([chunk_of("Hi", "stop")])

    with ScriptedServer(model_server) as upstream:
        [events] = run_on_pool(upstream, "s1", api_key="sk-upstream")

    assert events[-1].type == "done"
    assert {headers["Authorization"] for _, _, headers in upstream.requests} == {"Bearer sk-upstream"}


def test_a_health_check_that_fails_unexpectedly_logs_it_and_the_checks_go_on(monkeypatch, caplog):
    headers = upstream_module.Endpoint.headers
    failures = []

    def fails_once(endpoint):
        if not failures:
            failures.append(endpoint.name)
            raise RuntimeError("not a network error")
        return headers.fget(endpoint)

    monkeypatch.setattr(upstream_module.Endpoint, "headers", property(fails_once))

    async def model_server(request: web.Request) -> web.Response:
        return event_stream([chunk_of("Hi", "stop")])

    pool = UpstreamPool(InMemoryStreamStore(), health_interval_s=0.05)
    with ScriptedServer(model_server) as upstream:
        pool.configure([endpoint_from_json({**ENDPOINT, "base_url": upstream.base_url}, "e")])
        pool.submit(Job("s1", CHAT["messages"]), model="remote", prompt_tokens=1, body={"messages": CHAT["messages"]})
        wait_until(lambda: health_checks(upstream) >= 2, timeout=10)
        state = pool.snapshots()[0]["state"]
        pool.shut_down(1)

    assert failures == ["e"]
    assert "Health check of upstream e failed" in caplog.text
    assert state == "up"  # the next check found it answering


@pytest.mark.parametrize("streaming", [True, False], ids=["writing", "reading-a-long-prompt"])
def test_a_health_check_that_times_out_while_the_server_works_on_a_request_finds_it_busy_not_down(streaming):
    # As llama.cpp does: the list of models waits until the request in hand is answered,
    # whether its answer is being written or its long prompt is still being read (silent).
    working = asyncio.Event()
    stop_working = asyncio.Event()
    hung = asyncio.Event()  # later: silent with nothing to do

    async def models(request: web.Request) -> web.Response:
        await asyncio.sleep(0)
        while working.is_set() or hung.is_set():
            await asyncio.sleep(0.01)
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def model_server(request: web.Request) -> web.StreamResponse:
        working.set()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            while not stop_working.is_set():
                if streaming:
                    await response.write(f"data: {json.dumps(chunk_of('word '))}\n\n".encode())
                await asyncio.sleep(0.05)
            await response.write(f"data: {json.dumps(chunk_of('.', 'stop'))}\n\ndata: [DONE]\n\n".encode())
        finally:
            working.clear()
        return response

    store = InMemoryStreamStore()
    pool = UpstreamPool(store, health_interval_s=0.1)
    with ScriptedServer(model_server, models=models) as upstream:
        endpoint = {**ENDPOINT, "base_url": upstream.base_url, "connect_timeout_s": 0.3}
        pool.configure([endpoint_from_json(endpoint, "e")])
        pool.submit(Job("s1", CHAT["messages"]), model="remote", prompt_tokens=1, body={"messages": CHAT["messages"]})
        try:
            wait_until(working.is_set, timeout=10)
            asked = health_checks(upstream)
            states = set()
            while health_checks(upstream) < asked + 4:  # three timed out, waiting for the answer in vain
                states.add(pool.snapshots()[0]["state"])
                time.sleep(0.02)
            upstream.loop.call_soon_threadsafe(stop_working.set)
            events = wait_for_terminal(store, "s1", timeout=10)
            upstream.loop.call_soon_threadsafe(hung.set)
            wait_until(lambda: pool.snapshots()[0]["state"] == "down", timeout=10)  # idle and silent: down
        finally:
            pool.shut_down(1)
            upstream.loop.call_soon_threadsafe(hung.clear)  # the server's own shut-down waits for its checks

    assert states == {"up"}
    assert events[-1].type == "done"


@pytest.mark.parametrize(
    "chunk, says",
    [
        ([1, 2], "not a JSON object"),
        ({"choices": "Hi"}, "Reference: s1"),  # the log has the traceback under the reference
        ({"choices": [{"delta": "Hi"}]}, "Reference: s1"),
    ],
)
def test_a_chunk_of_an_unexpected_shape_ends_the_answer_with_an_error_not_a_hang(chunk, says):
    async def model_server(request: web.Request) -> web.Response:
        return event_stream([chunk_of("Hi"), chunk])

    with ScriptedServer(model_server) as upstream:
        [events] = run_on_pool(upstream, "s1")

    assert [e.data["delta"] for e in events if e.type == "token"] == ["Hi"]  # what came is kept
    assert events[-1].type == "error"
    assert says in events[-1].data["message"]


@pytest.mark.parametrize(
    "chunks, done, says",
    [
        ([chunk_of("x" * 2000, "stop")], True, "a line over 1000 bytes"),
        ([], False, "without sending any of it"),  # llama.cpp's Python server's answer to too long a prompt
    ],
    ids=["a-line-over-the-limit", "a-stream-without-a-word"],
)
def test_an_answer_the_server_cannot_give_fails_and_opens_no_circuit(monkeypatch, chunks, done, says):
    monkeypatch.setattr(wire, "MAX_LINE_BYTES", 1000)

    async def model_server(request: web.Request) -> web.Response:
        return event_stream(chunks, done=done)

    store = InMemoryStreamStore()
    pool = UpstreamPool(store, health_interval_s=60, failure_threshold=1)
    with ScriptedServer(model_server) as upstream:
        pool.configure(
            [endpoint_from_json({"model": "remote", "base_url": upstream.base_url, "upstream_model": "m"}, "e")]
        )
        pool.submit(Job("s1", CHAT["messages"]), model="remote", prompt_tokens=1, body={"messages": CHAT["messages"]})
        error = wait_for_terminal(store, "s1", timeout=10)[-1]
        snapshot = pool.snapshots()[0]
        pool.shut_down(1)

    assert error.type == "error"
    assert error.data["code"] == "upstream_error"
    assert says in error.data["message"]
    assert (snapshot["state"], snapshot["errors"]) == ("up", 1)


def test_a_stream_that_ends_without_done_keeps_what_it_sent():
    async def model_server(request: web.Request) -> web.Response:
        return event_stream([chunk_of("Hi"), chunk_of(" there", "stop")], done=False)

    with ScriptedServer(model_server) as upstream:
        [events] = run_on_pool(upstream, "s1")

    assert [e.data["delta"] for e in events if e.type == "token"] == ["Hi", " there"]
    assert events[-1].type == "done"
    assert events[-1].data["finish_reason"] == "stop"


async def test_a_pool_on_its_readers_loop_streams_there_without_a_thread_of_its_own():
    async def model_server(request: web.Request) -> web.Response:
        return event_stream([chunk_of("Hi"), chunk_of(" there", "stop")])

    store = InMemoryStreamStore()
    pool = UpstreamPool(store, health_interval_s=60)
    with ScriptedServer(model_server) as upstream:
        pool.configure(
            [endpoint_from_json({"model": "remote", "base_url": upstream.base_url, "upstream_model": "m"}, "e")]
        )
        pool.serve_on_running_loop()
        # Submitted from another thread, as a request's database thread does.
        job = Job("s1", CHAT["messages"])
        await asyncio.to_thread(pool.submit, job, model="remote", prompt_tokens=1, body={"messages": CHAT["messages"]})
        events = [event async for batch in store.read("s1") for event in batch]
        await asyncio.to_thread(pool.shut_down, 1)
        client = pool._client
        assert client is not None
        assert client.closed
        assert not pool._background  # nothing left behind

    assert [e.data["delta"] for e in events if e.type == "token"] == ["Hi", " there"]
    assert events[-1].type == "done"
    assert pool._loop is asyncio.get_running_loop()  # no loop, so no thread, of its own


def test_a_request_on_a_kept_alive_connection_the_server_closed_is_sent_again_once(caplog):
    """The server answers one request per connection and drops the connection under the
    next, as a server closing an idle connection just as it is reused: each answer still
    comes, on a connection of its own, and the endpoint has no error."""
    answered: set[tuple[str, int]] = set()  # the clients' addresses: a connection each

    async def one_request_per_connection(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        connection = request.transport.get_extra_info("peername")
        if connection in answered:
            request.transport.abort()
            return web.Response()  # goes nowhere: the connection is gone
        answered.add(connection)
        return event_stream([{"choices": [{"index": 0, "delta": {"content": "Hi"}}]}])

    store = InMemoryStreamStore()
    pool = UpstreamPool(store, health_interval_s=60)
    with ScriptedServer(one_request_per_connection) as upstream:
        pool.configure([endpoint_from_json({**ENDPOINT, "base_url": upstream.base_url}, "e")])
        for stream_id in ("s1", "s2", "s3"):
            pool.submit(Job(stream_id, CHAT["messages"]), model="remote", prompt_tokens=1, body=dict(CHAT))
            events = wait_for_terminal(store, stream_id, timeout=10)
            assert [event.type for event in events] == ["token", "done"], events
        snapshot = pool.snapshots()[0]
        pool.shut_down(1)
    assert len(answered) == 3
    assert (snapshot["errors"], snapshot["state"]) == (0, "up")
    assert "closed a kept-alive connection under a request; sending it again" in caplog.text


def test_a_connection_the_server_drops_twice_fails_the_answer_as_the_endpoints_fault():
    async def drops_every_request(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.abort()
        return web.Response()

    store = InMemoryStreamStore()
    pool = UpstreamPool(store, health_interval_s=60)
    with ScriptedServer(drops_every_request) as upstream:
        pool.configure([endpoint_from_json({**ENDPOINT, "base_url": upstream.base_url}, "e")])
        pool.submit(Job("s1", CHAT["messages"]), model="remote", prompt_tokens=1, body=dict(CHAT))
        events = wait_for_terminal(store, "s1", timeout=10)
        snapshot = pool.snapshots()[0]
        pool.shut_down(1)
    assert events[-1].type == "error"
    assert [method for method, _, _ in upstream.requests].count("POST") == 2  # sent once more, then given up
    assert snapshot["errors"] == 1
