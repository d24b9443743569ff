"""`usage.prompt_tokens_details.cached_tokens`: the prompt's tokens the real model did not
run again (GENERATION_PREFIX_CACHE_MB), per user, as OpenAI's API reports them."""

from __future__ import annotations

import json

import openai
import pytest
from prometheus_client import REGISTRY

from accounts.services import api_key_create
from tests.support.api_client import MODEL, post, sse
from tests.support.engines import install_engine

pytestmark = pytest.mark.django_db(transaction=True)

FIRST = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def cached_engine(stream_store, smollm):
    engine = install_engine(stream_store, smollm, prefix_cache_mb=64)
    yield engine
    engine.stop(timeout=30)


def ask(messages: list[dict[str, str]], key: str, **extra) -> dict:
    body = {"model": MODEL, "messages": messages, "max_tokens": 12, "temperature": 0, **extra}
    response = post("/v1/chat/completions", body, key)
    assert response.status_code == 200, response.content
    return response.json()


def test_a_conversations_next_turn_reports_its_earlier_turn_as_cached_and_no_one_elses(
    alice, bob, cached_engine, smollm
):
    alice_key, bob_key = (api_key_create(user=user, name="test")[1] for user in (alice, bob))
    opening = len(smollm.template_prefix())
    counted_before = cached_counted()

    first = ask(FIRST, alice_key)
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": opening}

    second_turn = [*FIRST, {"role": "assistant", "content": first["choices"][0]["message"]["content"]}]
    second_turn.append({"role": "user", "content": "And of Italy?"})
    second = ask(second_turn, alice_key)
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert first["usage"]["prompt_tokens"] < cached < second["usage"]["prompt_tokens"]

    # Bob's same conversation starts from the template's opening only.
    assert ask(second_turn, bob_key)["usage"]["prompt_tokens_details"] == {"cached_tokens": opening}
    # /metrics counts them.
    assert cached_counted() - counted_before == opening + cached + opening


def cached_counted() -> float:
    return REGISTRY.get_sample_value("chatsite_cached_prompt_tokens_total", {"model": MODEL}) or 0.0


def test_the_stream_usage_chunk_and_the_responses_api_say_it_too(alice, cached_engine, smollm):
    key = api_key_create(user=alice, name="test")[1]
    opening = len(smollm.template_prefix())
    streamed = post(
        "/v1/chat/completions",
        {"model": MODEL, "messages": FIRST, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}},
        key,
    )
    chunks = [json.loads(data) for _, data in sse(streamed) if data != "[DONE]"]
    usage = chunks[-1]["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": opening}
    # The official client reads it.
    parsed = openai.types.chat.ChatCompletionChunk.model_validate(chunks[-1])
    assert parsed.usage.prompt_tokens_details.cached_tokens == opening

    response = post("/v1/responses", {"model": MODEL, "input": FIRST[0]["content"], "max_output_tokens": 4}, key)
    assert response.json()["usage"]["input_tokens_details"]["cached_tokens"] >= opening
