"""Model servers behind chatsite (the upstream backend), with real processes on both sides.

The upstreams are real OpenAI-compatible servers: other chatsite processes serving the
synthetic model, `transformers serve` with the packaged model, llama.cpp's server with the
packaged model's GGUF (tool calls, JSON modes, logprobs), and a server that never answers.
chatsite in front of them is a real daphne process too.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import openai
import pytest

from inference.engine import Job
from inference.streams import InMemoryStreamStore
from inference.upstream import UpstreamPool, endpoint_from_json, estimate_prompt_tokens
from tests.support.livesite import LiveSite, unlimited_api_key
from tests.support.sites import LiveSites
from tests.support.upstreams import LlamaCppServer, SilentServer, TransformersServe

SYNTHETIC = {"CHAT_ENABLE_SYNTHETIC": "1", "CHAT_MODEL": "synthetic"}
CHAT = [{"role": "user", "content": "Tell me about streams."}]


class Upstream:
    """A chatsite process serving the synthetic model, as a model server."""

    def __init__(self, live_sites: LiveSites, tokens_per_s: int = 50) -> None:
        # Its own site, not a shared one: tests count its generations, and kill it.
        self.site = live_sites.own({**SYNTHETIC, "CHAT_SYNTHETIC_TOKENS_PER_S": str(tokens_per_s)})

    def __enter__(self) -> Upstream:
        self.site.__enter__()
        self.key = unlimited_api_key(self.site)
        return self

    def __exit__(self, *exc: object) -> None:
        self.site.__exit__(*exc)

    def endpoint(self, model: str = "remote", **settings: object) -> dict[str, object]:
        return {
            "model": model,
            "base_url": f"{self.site.base_url}/v1",
            "upstream_model": "synthetic",
            "api_key": self.key,
            **settings,
        }

    def active_generations(self) -> float:
        metrics = httpx.get(f"{self.site.base_url}/metrics").text
        return sum(float(value) for value in re.findall(r"^chatsite_active_generations\{[^}]*\} (\S+)", metrics, re.M))


@contextmanager
def front(live_sites: LiveSites, *endpoints: dict[str, object]) -> Iterator[tuple[LiveSite, openai.OpenAI]]:
    """chatsite serving these endpoints' models (shared by the tests that ask for the same
    ones), and an openai client of it for a new user."""
    site = live_sites.site({**SYNTHETIC, "CHAT_UPSTREAMS": json.dumps(endpoints)})
    yield site, openai.OpenAI(base_url=f"{site.base_url}/v1", api_key=unlimited_api_key(site), max_retries=0)


@pytest.fixture(scope="module")
def upstream(live_sites) -> Iterator[Upstream]:
    with Upstream(live_sites) as server:
        yield server


@pytest.fixture(scope="module")
def second_upstream(live_sites) -> Iterator[Upstream]:
    with Upstream(live_sites) as server:
        yield server


def text_of(chunks: list) -> str:
    return "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)


def raw_stream(site: LiveSite, key: str, body: dict, *, after: int | None = None) -> Iterator[str]:
    """The lines of a streamed completion, as they come."""
    url = f"{site.base_url}/v1/chat/completions"
    with httpx.stream("POST", url, json={**body, "stream": True}, headers={"Authorization": f"Bearer {key}"}) as r:
        assert r.status_code == 200, r.read()
        yield from r.iter_lines()


def test_an_upstream_model_streams_and_answers_whole_through_the_openai_client(upstream, live_sites):
    with front(live_sites, upstream.endpoint()) as (_, client):
        assert "remote" in [model.id for model in client.models.list()]

        stream = client.chat.completions.create(
            model="remote", messages=CHAT, max_tokens=12, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
        whole = client.chat.completions.create(model="remote", messages=CHAT, max_tokens=12)

    assert len(text_of(chunks).split()) == 12
    assert chunks[-1].usage.completion_tokens == 12
    assert whole.choices[0].message.content == text_of(chunks)
    assert whole.usage.completion_tokens == 12
    assert whole.usage.prompt_tokens == 4  # the upstream's own count


def test_an_upstream_stream_resumes_after_a_dropped_connection(upstream, live_sites):
    with front(live_sites, upstream.endpoint()) as (site, client):
        key = client.api_key
        body = {"model": "remote", "messages": CHAT, "max_tokens": 40, "stream_options": {"resumable": True}}
        seen, completion_id, last_id = [], None, None
        for line in raw_stream(site, key, body):
            if line.startswith("id: "):
                last_id = line[4:]
            if line.startswith("data: {") and re.search(r'"content":"[^"]', line):
                chunk = json.loads(line[6:])
                completion_id = chunk["id"]
                seen.append(chunk["choices"][0]["delta"]["content"])
                if len(seen) == 5:
                    break  # the connection drops
        resumed = httpx.get(
            f"{site.base_url}/v1/streams/{completion_id}",
            headers={"Authorization": f"Bearer {key}", "Last-Event-ID": last_id},
            timeout=30,
        ).text

    rest = [json.loads(line[6:]) for line in resumed.splitlines() if line.startswith("data: {")]
    text = "".join(seen) + "".join(
        chunk["choices"][0]["delta"].get("content") or "" for chunk in rest if chunk["choices"]
    )
    assert len(text.split()) == 40
    assert resumed.rstrip().endswith("data: [DONE]")


def test_stop_closes_the_upstream_request_so_the_server_stops_generating(upstream, live_sites):
    with front(live_sites, upstream.endpoint()) as (site, client):
        key = client.api_key
        body = {"model": "remote", "messages": CHAT, "max_tokens": 2000, "stream_options": {"resumable": True}}
        lines = raw_stream(site, key, body)
        completion_id = next(json.loads(line[6:])["id"] for line in lines if line.startswith("data: {"))
        deadline = time.monotonic() + 10
        while upstream.active_generations() < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert upstream.active_generations() == 1

        cancelled = httpx.post(
            f"{site.base_url}/v1/streams/{completion_id}/cancel", headers={"Authorization": f"Bearer {key}"}
        ).json()

        deadline = time.monotonic() + 5
        while upstream.active_generations() and time.monotonic() < deadline:
            time.sleep(0.05)
        rest = list(lines)
    assert cancelled["cancelled"] is True
    assert upstream.active_generations() == 0
    assert "data: [DONE]" in rest


def test_a_request_the_ledger_refuses_after_its_early_start_is_closed_at_the_server(upstream, live_sites):
    """The request to the model server goes out while the ledger writes (generation_admit's
    start_early): one that the ledger then refuses is closed, and the admitted one goes on.

    The refused request is closed within milliseconds, often while the server still admits
    it: the server (chatsite here) must then stop what its admission starts. The admitted
    answer runs 8 s there, and the count has 6 s to settle at one."""
    with front(live_sites, upstream.endpoint()) as (site, _):
        client = openai.OpenAI(
            base_url=f"{site.base_url}/v1", api_key=unlimited_api_key(site, max_concurrent_streams=1), max_retries=0
        )
        admitted = client.chat.completions.create(model="remote", messages=CHAT, max_tokens=400, stream=True)
        chunks = [next(admitted), next(admitted)]
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(model="remote", messages=CHAT, max_tokens=400, stream=True)
        deadline = time.monotonic() + 6
        while upstream.active_generations() != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        running_at_the_server = upstream.active_generations()
        chunks += list(admitted)
    assert refused.value.body["code"] == "too_many_concurrent_streams"
    assert running_at_the_server == 1
    assert len(text_of(chunks).split()) == 400


def test_a_model_servers_model_left_out_of_the_callers_models_does_not_exist_for_them(upstream, live_sites):
    """Model access (accounts.Account.allowed_models) holds for a model server's model as for
    an in-process one: not listed, and refused exactly as a model that does not exist."""
    with front(live_sites, upstream.endpoint()) as (site, everyone):
        key = unlimited_api_key(site, allowed_models=["synthetic"])
        client = openai.OpenAI(base_url=f"{site.base_url}/v1", api_key=key, max_retries=0)
        listed = {model.id for model in client.models.list()}
        with pytest.raises(openai.NotFoundError) as barred:
            client.chat.completions.create(model="remote", messages=CHAT, max_tokens=5)
        with pytest.raises(openai.NotFoundError) as unknown:
            client.chat.completions.create(model="no-such-model", messages=CHAT, max_tokens=5)
        answered = everyone.chat.completions.create(model="remote", messages=CHAT, max_tokens=5)
    assert listed == {"synthetic"}
    assert barred.value.body == {
        **unknown.value.body,
        "message": unknown.value.body["message"].replace("no-such-model", "remote"),
    }
    assert answered.model == "remote"


def test_a_days_budget_smaller_than_the_answer_stops_it_at_the_grant(upstream, live_sites):
    """Sent before the ledger's grant, the request asks for as many tokens as the plan and
    the context allow; the grant of what is left of the day's budget stops it."""
    with front(live_sites, upstream.endpoint()) as (site, _):
        budget = estimate_prompt_tokens(CHAT) + 12
        client = openai.OpenAI(
            base_url=f"{site.base_url}/v1", api_key=unlimited_api_key(site, tokens_per_day=budget), max_retries=0
        )
        chunks = list(client.chat.completions.create(model="remote", messages=CHAT, stream=True))
    assert len(text_of(chunks).split()) == 12
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "length"


def test_sigterm_lets_model_server_answers_finish_then_closes_the_rest_as_interrupted(upstream, live_sites):
    endpoints = json.dumps([upstream.endpoint()])
    with live_sites.own({**SYNTHETIC, "CHAT_UPSTREAMS": endpoints, "GRACEFUL_TIMEOUT": "2"}) as site:
        key = unlimited_api_key(site)
        short = raw_stream(site, key, {"model": "remote", "messages": CHAT, "max_tokens": 40})  # 0.8 s at 50/s
        long = raw_stream(site, key, {"model": "remote", "messages": CHAT, "max_tokens": 2000})  # 40 s
        next(line for line in short if '"content":"' in line)
        next(line for line in long if '"content":"' in line)

        assert site.process is not None
        site.process.send_signal(signal.SIGTERM)
        short_rest, long_rest = [line for line in short if line], [line for line in long if line]
        exit_code = site.process.wait(timeout=20)
        deadline = time.monotonic() + 5
        while upstream.active_generations() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert exit_code == 0
    assert short_rest[-1] == "data: [DONE]"
    assert '"finish_reason":"length"' in "".join(short_rest)
    errors = [json.loads(line[6:])["error"] for line in long_rest if line.startswith('data: {"error"')]
    assert errors
    assert errors[0]["message"] == "interrupted"
    assert upstream.active_generations() == 0  # the model server stopped generating too


def test_a_server_that_never_answers_ends_the_request_with_504_on_time(live_sites):
    with SilentServer() as silent:
        endpoint = {
            "model": "hung",
            "base_url": silent.base_url,
            "upstream_model": "x",
            "first_token_timeout_s": 2,
        }
        with front(live_sites, endpoint) as (_, client):
            started = time.monotonic()
            with pytest.raises(openai.APIStatusError) as refused:
                client.chat.completions.create(model="hung", messages=CHAT, max_tokens=5)
            waited = time.monotonic() - started
    assert refused.value.status_code == 504
    assert refused.value.body["code"] == "upstream_timeout"
    assert 1.5 < waited < 15  # its 2 s deadline, not a hang (a loaded machine adds seconds)


def test_with_one_endpoint_killed_under_load_new_requests_go_to_the_other_and_nothing_hangs(upstream, live_sites):
    with Upstream(live_sites) as first:
        endpoints = [first.endpoint(max_concurrent=8), upstream.endpoint(max_concurrent=8)]
        with front(live_sites, *endpoints) as (_, client):

            def answer(max_tokens: int) -> tuple[str, str | None]:
                stream = client.chat.completions.create(
                    model="remote", messages=CHAT, max_tokens=max_tokens, stream=True, timeout=30
                )
                pieces, error = [], None
                try:
                    for chunk in stream:
                        pieces.append(text_of([chunk]))
                except openai.APIError as failed:  # the error event after tokens
                    error = str(failed)
                return "".join(pieces), error

            with ThreadPoolExecutor(6) as pool:
                running = [pool.submit(answer, 150) for _ in range(6)]  # 3 s each at 50 tokens/s
                time.sleep(1.0)
                first.site.kill()
                later = [pool.submit(answer, 10) for _ in range(6)]
                finished = [future.result(timeout=60) for future in running]
                served = [future.result(timeout=60) for future in later]

    cut = [(text, error) for text, error in finished if error]
    assert cut
    assert all(text for text, _ in cut)  # streams on the killed server end with an error, text kept
    assert all(len(text.split()) == 150 for text, error in finished if not error)
    assert all(error is None and len(text.split()) == 10 for text, error in served)


def test_per_endpoint_caps_start_eight_streams_on_two_endpoints_and_queue_them_on_one(
    upstream, second_upstream, live_sites
):
    first, second = upstream, second_upstream
    # Long answers, each held open until all eight have started or been queued: a stream that
    # ended (or was closed) early would free its place and let a later one in without waiting.
    body = {"model": "remote", "messages": CHAT, "max_tokens": 2000}

    def opening(start: threading.Barrier, decided: threading.Barrier, site: LiveSite, key: str) -> list[str]:
        start.wait()
        lines, stream = [], raw_stream(site, key, body)  # named, so that it stays open after the loop
        for line in stream:
            lines.append(line)
            if line.startswith(": queued") or re.search(r'"content":"[^"]', line):  # queued, or its first token
                break
        decided.wait(timeout=60)
        return lines

    for endpoints, queued in (
        ([first.endpoint(max_concurrent=4), second.endpoint(max_concurrent=4)], 0),
        ([first.endpoint(max_concurrent=4)], 4),
    ):
        with front(live_sites, *endpoints) as (site, client), ThreadPoolExecutor(8) as pool:
            start, decided = threading.Barrier(8), threading.Barrier(8)  # all eight at once, all eight open
            openings = list(pool.map(opening, [start] * 8, [decided] * 8, [site] * 8, [client.api_key] * 8))
        waited = [lines for lines in openings if lines[-1].startswith(": queued")]
        assert len(waited) == queued, openings
        if queued:
            ahead = sorted(int(re.search(r"(\d+) ahead", lines[-1]).group(1)) for lines in waited)
            assert ahead == [0, 1, 2, 3]


@pytest.fixture(scope="module")
def transformers_serve() -> Iterator[TransformersServe]:
    with TransformersServe() as server:
        yield server


def test_transformers_serve_as_an_upstream_streams_answers_whole_and_stops(transformers_serve, live_sites):
    endpoint = {
        "model": "smol-upstream",
        "base_url": transformers_serve.base_url,
        "upstream_model": transformers_serve.model,
    }
    with front(live_sites, endpoint) as (site, client):
        stream = client.chat.completions.create(
            model="smol-upstream",
            messages=CHAT,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        whole = client.chat.completions.create(model="smol-upstream", messages=CHAT, max_tokens=16, temperature=0)

        body = {"model": "smol-upstream", "messages": CHAT, "max_tokens": 400, "stream_options": {"resumable": True}}
        lines = raw_stream(site, client.api_key, body)
        completion_id = next(json.loads(line[6:])["id"] for line in lines if re.search(r'"content":"[^"]', line))
        httpx.post(
            f"{site.base_url}/v1/streams/{completion_id}/cancel", headers={"Authorization": f"Bearer {client.api_key}"}
        )
        stopped = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]

    assert text_of(chunks)
    assert whole.choices[0].message.content == text_of(chunks)
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens <= 16
    assert any(chunk["choices"] and chunk["choices"][0]["finish_reason"] == "stop" for chunk in stopped)
    assert sum(1 for chunk in stopped if chunk["choices"] and chunk["choices"][0]["delta"].get("content")) < 400


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL_WEATHER = {"type": "function", "function": {"name": "get_weather"}}


LATEST_RECORD = """
import json
from accounts.models import UsageRecord
print(json.dumps(UsageRecord.objects.values("completion_tokens", "usage_estimated", "status").first()))
"""


def latest_usage_record(site: LiveSite) -> dict:
    """The ledger's newest record on `site`, read in a process of its own (the site's database)."""
    command = [sys.executable, "manage.py", "shell", "-c", LATEST_RECORD]
    output = subprocess.run(command, cwd=site.root, env=site.env, capture_output=True, text=True, check=True).stdout
    return json.loads(output.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def llama_cpp() -> Iterator[LlamaCppServer]:
    with LlamaCppServer() as server:
        yield server


def test_tool_calls_stream_from_a_model_server_whole_and_on_resume(llama_cpp, live_sites):
    # llama.cpp's stream reports no usage: the answer is counted with the model's tokenizer.
    with front(live_sites, llama_cpp.endpoint(tokenizer="smollm2-135m-instruct")) as (site, client):
        request = {"model": "smol-tools", "messages": ASK_WEATHER, "tools": [WEATHER], "tool_choice": CALL_WEATHER}
        chunks = list(client.chat.completions.create(**request, max_tokens=40, temperature=0, stream=True))
        whole = client.chat.completions.create(**request, max_tokens=40, temperature=0)
        replay = httpx.get(
            f"{site.base_url}/v1/streams/{chunks[0].id}?after=0",
            headers={"Authorization": f"Bearer {client.api_key}"},
            timeout=30,
        ).text
        answered = client.chat.completions.create(
            model="smol-tools",
            messages=[
                *ASK_WEATHER,
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [whole.choices[0].message.tool_calls[0].model_dump()],
                },
                {"role": "tool", "tool_call_id": whole.choices[0].message.tool_calls[0].id, "content": "Sunny, 21 C"},
            ],
            tools=[WEATHER],
            max_tokens=12,
            temperature=0,
        )
        # A day's budget with room for three tokens of the answer (the prompt as chatsite
        # counted it, tools included, since the server reports no usage): the call stops there.
        budget = whole.usage.prompt_tokens + 3
        frugal = openai.OpenAI(
            base_url=f"{site.base_url}/v1", api_key=unlimited_api_key(site, tokens_per_day=budget), max_retries=0
        )
        capped = list(frugal.chat.completions.create(**request, temperature=0, stream=True))

    deltas = [call for chunk in chunks if chunk.choices for call in chunk.choices[0].delta.tool_calls or []]
    assert len(deltas) > 2  # the call arrives in pieces, as the server generates it
    streamed_arguments = "".join(delta.function.arguments or "" for delta in deltas)
    assert deltas[0].function.name == "get_weather"
    assert json.loads(streamed_arguments) == {"city": "Paris"}
    # The server names the call in every delta; chatsite, as OpenAI, in the first only.
    assert deltas[0].id
    assert not any(delta.function.name or delta.id for delta in deltas[1:])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    call = whole.choices[0].message.tool_calls[0]
    assert whole.choices[0].finish_reason == "tool_calls"
    assert whole.choices[0].message.content is None
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert 0 < whole.usage.completion_tokens < 40  # a tool call is counted too

    replayed = [json.loads(line[6:]) for line in replay.splitlines() if line.startswith("data: {")]
    replayed_calls = [
        c for chunk in replayed if chunk["choices"] for c in chunk["choices"][0]["delta"].get("tool_calls", [])
    ]
    assert "".join(c["function"]["arguments"] for c in replayed_calls) == streamed_arguments
    assert answered.choices[0].message.content
    assert answered.usage.completion_tokens == 12
    capped_calls = [call for chunk in capped if chunk.choices for call in chunk.choices[0].delta.tool_calls or []]
    assert len(capped_calls) == 3
    assert [c.choices[0].finish_reason for c in capped if c.choices][-1] == "length"


def test_json_modes_and_logprobs_pass_through_to_a_model_server(llama_cpp, live_sites):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}}, "required": ["city"]}
    with front(live_sites, llama_cpp.endpoint()) as (site, client):
        answer = client.chat.completions.create(
            model="smol-tools",
            messages=[{"role": "user", "content": "Name a city in France."}],
            response_format={"type": "json_object", "schema": schema},  # llama.cpp's form of a JSON schema
            max_tokens=64,
            temperature=0,
        )
        chunks = list(
            client.chat.completions.create(
                model="smol-tools",
                messages=ASK_WEATHER,
                logprobs=True,
                top_logprobs=2,
                max_tokens=5,
                temperature=0,
                stream=True,
            )
        )
        # Its stream reports no usage and this endpoint names no tokenizer: the ledger estimates.
        record = latest_usage_record(site)
        refused = httpx.post(
            f"{site.base_url}/v1/chat/completions",
            json={"model": "synthetic", "messages": ASK_WEATHER, "tools": [WEATHER]},
            headers={"Authorization": f"Bearer {client.api_key}"},
        )

    assert isinstance(json.loads(answer.choices[0].message.content)["city"], str)
    logprobs = [
        entry
        for chunk in chunks
        if chunk.choices and chunk.choices[0].logprobs
        for entry in chunk.choices[0].logprobs.content
    ]
    assert len(logprobs) == 5
    assert all(entry.logprob <= 0 and len(entry.top_logprobs) == 2 for entry in logprobs)
    assert "".join(entry.token for entry in logprobs) == text_of(chunks)
    assert record["usage_estimated"]
    assert record["status"] == "complete"
    assert 0 < record["completion_tokens"] <= 5  # never more than the server was let write
    # The in-process models still refuse what only model servers do, naming the field.
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "tools"


def test_requests_a_model_server_cannot_take_fail_alone_and_open_no_circuit(llama_cpp, live_sites):
    """llama.cpp answers a tool it cannot read with a 500, and a prompt longer than its
    context with a stream that ends before a word: that user's request fails (an empty
    answer would pass for a complete one), but the endpoint's circuit stays closed, so that
    nobody else is refused for it."""
    with front(live_sites, llama_cpp.endpoint()) as (site, client):
        bad = {"model": "smol-tools", "messages": ASK_WEATHER, "tools": [{"type": "function"}], "max_tokens": 4}
        # Longer than the server's context: its stream ends before a word, not even [DONE].
        too_long = {"model": "smol-tools", "messages": [{"role": "user", "content": "1 2 3 " * 1000}], "stream": True}
        headers = {"Authorization": f"Bearer {client.api_key}"}
        refused = [httpx.post(f"{site.base_url}/v1/chat/completions", json=bad, headers=headers) for _ in range(3)]
        with httpx.stream("POST", f"{site.base_url}/v1/chat/completions", json=too_long, headers=headers) as response:
            failed = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
        refused += [httpx.post(f"{site.base_url}/v1/chat/completions", json=bad, headers=headers) for _ in range(2)]
        served = client.chat.completions.create(model="smol-tools", messages=ASK_WEATHER, max_tokens=4, temperature=0)

    assert [response.status_code for response in refused] == [502] * 5, refused[-1].text
    assert refused[-1].json()["error"]["code"] == "upstream_error"
    assert failed[-1]["error"]["message"] == "The model server ended the answer without sending any of it."
    assert served.choices[0].message.content
    assert served.usage.completion_tokens == 4


LONG_ANSWER = [{"role": "user", "content": "Count from 1 to 1000, one number per line."}]
# About 1,500 tokens of prompt (2,048 fit): llama.cpp reads it for a second or more here, saying nothing.
LONG_PROMPT = [{"role": "user", "content": " ".join(map(str, range(400))) + "\nWhich number comes last?"}]


@pytest.mark.parametrize(
    "ask, max_tokens, busy_s",
    # The answer stops after about 100 tokens: 1.2-1.4 s on a quiet machine, during which
    # checks every 0.2 s, each given 0.3 s, time out several times.
    [(LONG_ANSWER, 1500, 0.8), (LONG_PROMPT, 8, 1.0)],
    ids=["writing-a-long-answer", "reading-a-long-prompt"],
)
def test_a_model_server_busy_with_a_request_is_not_marked_down_by_its_health_checks(llama_cpp, ask, max_tokens, busy_s):
    """llama.cpp serves one request at a time: a health check waits behind the request in
    hand, its long answer being written or its long prompt being read, and times out. The
    endpoint stays up, so the next request waits its turn instead of being refused for want
    of an endpoint."""
    store = InMemoryStreamStore()
    pool = UpstreamPool(store, health_interval_s=0.2)
    endpoint = endpoint_from_json(llama_cpp.endpoint(connect_timeout_s=0.3), "llama")
    pool.configure([endpoint])
    body = {"messages": ask, "max_tokens": max_tokens, "temperature": 0}
    try:
        pool.submit(Job("long", ask), model=endpoint.model, prompt_tokens=1, body=body)
        states, started = set(), time.monotonic()
        while not (events := store.events("long")) or not events[-1].terminal:
            states.add(pool.snapshots()[0]["state"])
            time.sleep(0.05)
        took_s = time.monotonic() - started
    finally:
        pool.shut_down(1)

    assert events[-1].type == "done"
    assert took_s > busy_s, (took_s, len(events), events[-1].data)  # several checks timed out behind it
    assert states == {"up"}
