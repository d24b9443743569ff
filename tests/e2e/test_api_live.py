"""The API through the official `openai` client against a real daphne and the real model."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import httpx
import openai
import pytest

from tests.support.engines import wait_until
from tests.support.livesite import ROOT, LiveSite, user_with_api_key

MODEL = "smollm2-135m-instruct"
HELLO = [{"role": "user", "content": "Write a short poem about rivers."}]


def manage(site: LiveSite, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=site.env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.fixture(scope="module")
def alice_key(live_site) -> str:
    return user_with_api_key(live_site, "api-alice")


@pytest.fixture
def client(live_site, alice_key) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live_site.base_url}/v1", api_key=alice_key, max_retries=0)


def active_generations(site: LiveSite) -> int:
    metrics = httpx.get(f"{site.base_url}/metrics").text
    return round(sum(float(v) for v in re.findall(r"^chatsite_active_generations\{[^}]*\} (\S+)$", metrics, re.M)))


def test_the_api_and_the_probes_skip_the_browsers_middleware_but_keep_its_security_headers(live_site, alice_key):
    """chatsite.handlers.ProgramsHandler: no session or CSRF middleware (thread hops) for programs."""
    api = httpx.get(f"{live_site.base_url}/v1/models", headers={"Authorization": f"Bearer {alice_key}"})
    probe = httpx.get(f"{live_site.base_url}/healthz")
    page = httpx.get(f"{live_site.base_url}/accounts/login/")
    assert api.status_code == probe.status_code == page.status_code == 200
    for response in (api, probe, page):
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["X-Frame-Options"] == "DENY"
        assert "default-src 'none'" in response.headers["Content-Security-Policy"]
    assert "Vary" not in api.headers
    assert "Vary" not in probe.headers  # no session, no CSRF cookie looked at
    assert "Cookie" in page.headers["Vary"]
    assert "csrftoken" in page.cookies


def test_the_server_logs_one_json_line_per_request_and_generation_and_never_a_key_or_a_prompt(live_site, client):
    secret = "zebra-umbrella-4711"
    client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"Say {secret}"}],
        max_tokens=4,
        extra_headers={"X-Request-ID": "live-log-1"},
    )
    models = httpx.get(
        f"{live_site.base_url}/v1/models?api_key={client.api_key}", headers={"X-Request-ID": "live-log-2"}
    )
    assert models.headers["X-Request-Id"] == "live-log-2"

    def records(request_id: str) -> list[dict]:
        lines = [json.loads(line) for line in live_site.log_path.read_text().splitlines() if line.strip()]  # JSON each
        return [line for line in lines if line.get("request_id") == request_id]

    # The generation's line is written as its result is saved, which may come after the answer.
    wait_until(lambda: len(records("live-log-1")) >= 2 and bool(records("live-log-2")), timeout=10)
    mine = records("live-log-1")
    text = live_site.log_path.read_text()
    (access,) = [line for line in mine if line["logger"] == "chatsite.access"]
    (generation,) = [line for line in mine if line["logger"] == "chatsite.generation"]
    assert access["status"] == 200
    assert access["method"] == "POST"
    assert access["path"] == "/v1/chat/completions"
    assert access["user_id"]
    assert access["key_prefix"]
    assert access["model"] == MODEL
    assert access["stream_id"]
    assert generation["stream_id"] == access["stream_id"]
    assert 1 <= generation["completion_tokens"] <= 4
    assert generation["ttft_ms"] is not None
    assert generation["duration_ms"] >= generation["ttft_ms"]
    assert client.api_key not in text
    assert secret not in text


def test_a_host_not_allowed_is_refused_under_v1_too(live_site, alice_key):
    """ProgramsHandler runs no CommonMiddleware, but checks ALLOWED_HOSTS as it would."""
    refused = httpx.get(
        f"{live_site.base_url}/v1/models", headers={"Authorization": f"Bearer {alice_key}", "Host": "evil.example"}
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["type"] == "invalid_request_error"


def test_models_list(client):
    assert MODEL in [model.id for model in client.models.list()]


def test_streaming_chat_with_usage(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=HELLO, stream=True, max_tokens=24, temperature=0, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text) > 20
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].usage.completion_tokens == 24
    assert chunks[-1].usage.prompt_tokens > 5


def test_non_streaming_equals_streaming_for_greedy(client):
    whole = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=16, temperature=0)
    streamed = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=16, temperature=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert whole.choices[0].message.content == text
    assert whole.usage.completion_tokens == 16
    assert whole.choices[0].finish_reason == "length"


def test_stop_sequence(client):
    whole = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=40, temperature=0)
    text = whole.choices[0].message.content
    stop = text.split()[3]
    cut = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=40, temperature=0, stop=[stop])
    assert cut.choices[0].message.content == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_legacy_completion(client):
    completion = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0)
    assert completion.choices[0].text
    assert completion.usage.completion_tokens == 5


def test_resume_after_a_dropped_connection_equals_the_uninterrupted_text(client, live_site, alice_key):
    uninterrupted = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=40, temperature=0)
    headers = {"Authorization": f"Bearer {alice_key}"}
    body = {
        "model": MODEL,
        "messages": HELLO,
        "max_tokens": 40,
        "temperature": 0,
        "stream": True,
        "stream_options": {"resumable": True},
    }
    seen, last_id, completion_id = [], None, None
    with httpx.stream("POST", f"{live_site.base_url}/v1/chat/completions", json=body, headers=headers) as response:
        for line in response.iter_lines():
            if line.startswith("id: "):
                last_id = line[4:]
            elif line.startswith("data: {"):
                chunk = openai.types.chat.ChatCompletionChunk.model_validate_json(line[6:])
                completion_id = chunk.id
                seen.append(chunk.choices[0].delta.content or "")
                if len(seen) >= 6:
                    break  # drop the connection mid-answer
    resumed = []
    with httpx.stream(
        "GET", f"{live_site.base_url}/v1/streams/{completion_id}", headers={**headers, "Last-Event-ID": last_id}
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunk = openai.types.chat.ChatCompletionChunk.model_validate_json(line[6:])
                if chunk.choices:
                    resumed.append(chunk.choices[0].delta.content or "")
    assert "".join(seen + resumed) == uninterrupted.choices[0].message.content


USAGE_OF_STREAM = """
import json
from accounts.models import UsageRecord
print(json.dumps(UsageRecord.objects.values("status", "completion_tokens").get(stream_id="{stream_id}")))
"""


def test_client_disconnect_cancels_the_generation(client, live_site):
    stream = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=400, stream=True)
    chunks = [next(stream) for _ in range(4)]
    assert active_generations(live_site) == 1
    stream.close()
    # 400 tokens take 20 s here; cancelled, it ends within a decoding step of the disconnect.
    wait_until(lambda: active_generations(live_site) == 0, timeout=10)
    stream_id = chunks[0].id.split("-", 1)[1]
    # --no-imports: Django 5.2's shell otherwise starts by saying what it imported.
    record = json.loads(manage(live_site, "shell", "--no-imports", "-c", USAGE_OF_STREAM.format(stream_id=stream_id)))
    assert record["status"] == "stopped"
    assert record["completion_tokens"] < 100


def test_bad_key_unknown_model_and_bad_input_raise_the_matching_errors(live_site, client):
    bad = openai.OpenAI(base_url=f"{live_site.base_url}/v1", api_key="cs-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as error:
        bad.models.list()
    assert error.value.code == "invalid_api_key"
    with pytest.raises(openai.NotFoundError) as error:
        client.chat.completions.create(model="gpt-9", messages=HELLO)
    assert error.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=HELLO, temperature=5)
    assert error.value.param == "temperature"


def test_revoked_key_is_refused(live_site):
    key = user_with_api_key(live_site, "api-revoked")
    manage(
        live_site,
        "shell",
        "-c",
        "from accounts.models import ApiKey; [k.revoke() for k in ApiKey.objects.filter(user__username='api-revoked')]",
    )
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{live_site.base_url}/v1", api_key=key, max_retries=0).models.list()


def test_rate_limit_refusal_carries_retry_after_and_headers(live_site):
    key = user_with_api_key(live_site, "api-limited")
    manage(
        live_site,
        "shell",
        "-c",
        "from accounts.services import account_for; from django.contrib.auth.models import User; "
        "a = account_for(User.objects.get(username='api-limited')); a.requests_per_minute = 1; a.save()",
    )
    limited = openai.OpenAI(base_url=f"{live_site.base_url}/v1", api_key=key, max_retries=0)
    limited.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=1)
    with pytest.raises(openai.RateLimitError) as error:
        limited.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=1)
    headers = error.value.response.headers
    assert error.value.code == "rate_limit_exceeded"
    assert int(headers["retry-after"]) > 0
    assert headers["x-ratelimit-remaining-requests"] == "0"


def test_bob_cannot_resume_or_cancel_alices_stream(client, live_site):
    whole = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
    bob = {"Authorization": f"Bearer {user_with_api_key(live_site, 'api-bob')}"}
    assert httpx.get(f"{live_site.base_url}/v1/streams/{whole.id}", headers=bob).status_code == 404
    assert httpx.post(f"{live_site.base_url}/v1/streams/{whole.id}/cancel", headers=bob).status_code == 404


def test_errors_under_v1_are_error_objects_through_daphne_and_pages_keep_html(live_site, alice_key):
    """ProgramsHandler serves /v1/ without middleware: its errors are the API's all the same."""
    auth = {"Authorization": f"Bearer {alice_key}"}
    unknown = httpx.post(f"{live_site.base_url}/v1/nope", headers=auth)
    wrong_method = httpx.delete(f"{live_site.base_url}/v1/chat/completions", headers=auth)
    too_big = httpx.post(  # over Django's DATA_UPLOAD_MAX_MEMORY_SIZE, 2.5 MB
        f"{live_site.base_url}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "x" * 3_000_000}]},
        headers=auth,
    )
    page = httpx.get(f"{live_site.base_url}/no-such-page/")

    for response, status in ((unknown, 404), (wrong_method, 405), (too_big, 413)):
        assert response.status_code == status
        assert response.headers["content-type"] == "application/json"
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
        assert response.headers["x-request-id"]
    assert wrong_method.headers["allow"] == "POST"
    assert page.status_code == 404
    assert page.headers["content-type"].startswith("text/html")


def test_the_openai_client_may_send_the_documented_fields_at_their_neutral_values(client):
    neutral = {
        "n": 1,
        "frequency_penalty": 0,
        "presence_penalty": 0,
        "logit_bias": {},
        "user": "user-1234",
        "seed": 7,
        "temperature": 0,
        "top_p": 1,
        "max_tokens": 4,
    }
    chat = {
        "logprobs": False,
        "response_format": {"type": "text"},
        "parallel_tool_calls": False,
        "store": False,
        "metadata": {"app": "tests"},
        "service_tier": "auto",
        "modalities": ["text"],
    }
    whole = client.chat.completions.create(model=MODEL, messages=HELLO, **neutral, **chat)
    streamed = client.chat.completions.create(model=MODEL, messages=HELLO, stream=True, **neutral, **chat)
    text = client.completions.create(
        model=MODEL, prompt="The capital of France is", best_of=1, echo=False, suffix=None, logprobs=None, **neutral
    )

    assert whole.choices[0].message.content == "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert whole.usage.completion_tokens == 4
    assert text.usage.completion_tokens == 4
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=HELLO, n=2)
    assert refused.value.param == "n"
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt="Hi", frequency_penalty=0.5)
    assert refused.value.param == "frequency_penalty"
    assert "does not support" in refused.value.message
