"""The response cache through the official `openai` client against a real daphne and the real model."""

from __future__ import annotations

import openai
import pytest

from tests.support.livesite import user_with_api_key

MODEL = "smollm2-135m-instruct"

QUESTION = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def client(cache_site) -> openai.OpenAI:
    key = user_with_api_key(cache_site, "api-cache-alice")
    return openai.OpenAI(base_url=f"{cache_site.base_url}/v1", api_key=key, max_retries=0)


def test_the_openai_client_gets_the_same_text_from_the_cache_streamed_or_not(client):
    def ask(**options):
        return client.chat.completions.with_raw_response.create(
            model=MODEL, messages=QUESTION, temperature=0, max_tokens=12, **options
        )

    first, again = ask(), ask()
    assert first.headers["x-chatsite-cache"] == "miss"
    assert again.headers["x-chatsite-cache"] == "hit"
    text = first.parse().choices[0].message.content
    assert text
    assert again.parse().choices[0].message.content == text
    assert again.parse().usage.completion_tokens == 0  # a hit counts no completion tokens

    with client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=12, stream=True
    ) as streamed:
        assert streamed.headers["x-chatsite-cache"] == "hit"
        pieces = [chunk.choices[0].delta.content or "" for chunk in streamed.parse() if chunk.choices]
    assert "".join(pieces) == text


def test_a_seeded_sampled_request_is_cached_and_an_unseeded_one_never(client):
    def ask(**options):
        return client.chat.completions.with_raw_response.create(
            model=MODEL, messages=QUESTION, temperature=0.9, max_tokens=8, **options
        )

    assert ask(seed=7).headers["x-chatsite-cache"] == "miss"
    assert ask(seed=7).headers["x-chatsite-cache"] == "hit"
    assert "x-chatsite-cache" not in ask().headers
