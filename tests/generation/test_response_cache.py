"""The response cache: a complete answer to a deterministic request, streamed again."""

from __future__ import annotations

import dataclasses
import json
import re
import time
import uuid

import pytest
from django.test import Client

from accounts.models import UsageRecord
from accounts.services import api_key_create, usage_rollup
from generation.backends.response_cache import CachedAnswer, response_cache_key, response_cache_lookup
from generation.models import Conversation, Message
from generation.services import message_regenerate, message_send
from inference.generators import SYNTHETIC_TEXT, GenerationParams, SyntheticGenerator
from tests.support.api_client import MODEL, get, post, sse
from tests.support.engines import install_engine, wait_for_terminal

pytestmark = pytest.mark.django_db(transaction=True)

GREEDY = {"model": MODEL, "messages": [{"role": "user", "content": "Name a river."}], "temperature": 0}


@pytest.fixture
def response_cache(settings) -> None:
    """The cache on, per user, with an empty cache of this test's own."""
    settings.CHAT_RESPONSE_CACHE = "user"
    if not settings.REDIS_URL:  # on Redis, conftest already gives each test a key prefix of its own
        backend = "django.core.cache.backends.locmem.LocMemCache"
        settings.CACHES = {"default": {"BACKEND": backend, "LOCATION": uuid.uuid4().hex}}


@pytest.fixture
def alice_key(alice) -> str:
    return api_key_create(user=alice, name="test")[1]


@pytest.fixture
def bob_key(bob) -> str:
    return api_key_create(user=bob, name="test")[1]


def streamed(response) -> tuple[str, list[str | None], dict]:
    """The text of a streamed chat completion, its event ids, and its usage chunk."""
    events = sse(response)
    assert events[-1] == (None, "[DONE]")
    chunks = [json.loads(data) for _, data in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    usage = next((c["usage"] for c in chunks if c.get("usage")), {})
    return text, [event_id for event_id, _ in events[:-1]], usage


def answer_text(response) -> str:
    assert response.status_code == 200, response.content
    return response.json()["choices"][0]["message"]["content"]


def test_a_hit_streams_the_real_models_answer_again_with_the_same_events(alice, alice_key, real_engine, response_cache):
    body = {**GREEDY, "max_tokens": 12, "stream": True, "stream_options": {"include_usage": True}}
    first = post("/v1/chat/completions", body, alice_key)
    text, ids, usage = streamed(first)  # read to its end: the answer is kept once complete
    again = post("/v1/chat/completions", body, alice_key)
    again_text, again_ids, again_usage = streamed(again)
    whole = post("/v1/chat/completions", {**GREEDY, "max_tokens": 12}, alice_key)

    assert first["x-chatsite-cache"] == "miss"
    assert again["x-chatsite-cache"] == "hit"
    assert whole["x-chatsite-cache"] == "hit"
    assert text.strip()
    assert again_text == text
    assert answer_text(whole) == text
    # The same events under the same ids, so that resume points mean the same; a reader
    # gets the hit's tokens, all there at once, in fewer SSE events (under the last one's id).
    assert again_ids[-1] == ids[-1]
    # A hit counts as a request and its prompt, not as completion tokens.
    assert usage["completion_tokens"] > 0
    assert again_usage["completion_tokens"] == 0
    assert again_usage["prompt_tokens"] == usage["prompt_tokens"]
    records = list(UsageRecord.objects.filter(user=alice).order_by("created_at", "pk"))
    assert [(r.cache, r.status) for r in records] == [("miss", "complete"), ("hit", "complete"), ("hit", "complete")]
    assert records[0].completion_tokens == usage["completion_tokens"]
    assert records[1].completion_tokens == records[2].completion_tokens == 0
    tokens = [
        [(e.seq, e.data["delta"]) for e in real_engine.store.events(r.stream_id) if e.type == "token"] for r in records
    ]
    assert tokens[1] == tokens[2] == tokens[0]
    assert len(tokens[0]) > 1


@pytest.mark.parametrize(
    "change",
    [
        {"messages": [{"role": "user", "content": "Name a lake."}]},
        {"messages": [{"role": "system", "content": "Be brief."}, *GREEDY["messages"]]},
        {"max_tokens": 7},
        {"top_p": 0.5},
        {"seed": 1},
        {"stop": ["sea"]},
        {"temperature": 0.5, "seed": 0},
    ],
    ids=["messages", "system", "max_tokens", "top_p", "seed", "stop", "temperature"],
)
def test_a_request_that_differs_in_any_parameter_misses(alice, alice_key, fast_engine, response_cache, change):
    base = {**GREEDY, "max_tokens": 6, "seed": 0}
    assert post("/v1/chat/completions", base, alice_key)["x-chatsite-cache"] == "miss"
    assert post("/v1/chat/completions", {**base, **change}, alice_key)["x-chatsite-cache"] == "miss"
    assert post("/v1/chat/completions", base, alice_key)["x-chatsite-cache"] == "hit"


def test_the_key_covers_the_model_the_prompt_the_user_and_every_generation_parameter(settings):
    settings.CHAT_RESPONSE_CACHE = "user"
    prompt = [{"role": "user", "content": "Hi"}]
    params = GenerationParams(max_tokens=8, temperature=0.0)
    key = response_cache_key(user_id=1, model=MODEL, prompt=prompt, params=params)
    variants = {
        "model": response_cache_key(user_id=1, model="synthetic", prompt=prompt, params=params),
        "prompt": response_cache_key(user_id=1, model=MODEL, prompt="Hi", params=params),
        "user": response_cache_key(user_id=2, model=MODEL, prompt=prompt, params=params),
    }
    changed = {
        "max_tokens": 9,
        "temperature": 0.1,
        "top_p": 0.9,
        "seed": 3,
        "stop": ("x",),
        "extra": {"tools": []},
    }
    assert set(changed) == {field.name for field in dataclasses.fields(GenerationParams)}  # a new one is tested too
    for name, value in changed.items():
        variants[name] = response_cache_key(
            user_id=1, model=MODEL, prompt=prompt, params=dataclasses.replace(params, **{name: value})
        )
    assert key not in variants.values()
    assert len(set(variants.values())) == len(variants)
    assert response_cache_key(user_id=1, model=MODEL, prompt=prompt, params=params) == key


def test_user_scope_never_serves_one_users_answer_to_another(alice_key, bob_key, fast_engine, response_cache):
    assert post("/v1/chat/completions", GREEDY, alice_key)["x-chatsite-cache"] == "miss"
    assert post("/v1/chat/completions", GREEDY, bob_key)["x-chatsite-cache"] == "miss"
    assert post("/v1/chat/completions", GREEDY, bob_key)["x-chatsite-cache"] == "hit"


def test_global_scope_serves_one_users_answer_to_another(alice_key, bob_key, fast_engine, response_cache, settings):
    settings.CHAT_RESPONSE_CACHE = "global"
    alices = post("/v1/chat/completions", GREEDY, alice_key)
    bobs = post("/v1/chat/completions", GREEDY, bob_key)
    assert alices["x-chatsite-cache"] == "miss"
    assert bobs["x-chatsite-cache"] == "hit"
    assert answer_text(bobs) == answer_text(alices)


def test_an_entry_expires_after_its_ttl(alice_key, fast_engine, response_cache, settings):
    settings.CHAT_RESPONSE_CACHE_TTL = 1
    assert post("/v1/chat/completions", GREEDY, alice_key)["x-chatsite-cache"] == "miss"
    assert post("/v1/chat/completions", GREEDY, alice_key)["x-chatsite-cache"] == "hit"
    time.sleep(1.2)
    assert post("/v1/chat/completions", GREEDY, alice_key)["x-chatsite-cache"] == "miss"


def test_a_request_that_samples_without_a_seed_is_never_cached(alice, alice_key, fast_engine, response_cache):
    sampled = {**GREEDY, "temperature": 0.7}
    responses = [post("/v1/chat/completions", sampled, alice_key) for _ in range(2)]
    assert all(r.status_code == 200 and not r.has_header("x-chatsite-cache") for r in responses)
    records = UsageRecord.objects.filter(user=alice)
    assert [r.cache for r in records] == ["", ""]
    assert all(r.completion_tokens > 0 for r in records)


def test_with_the_cache_off_nothing_is_cached(alice_key, fast_engine, response_cache, settings):
    settings.CHAT_RESPONSE_CACHE = "off"
    responses = [post("/v1/chat/completions", GREEDY, alice_key) for _ in range(2)]
    assert not any(r.has_header("x-chatsite-cache") for r in responses)


def test_a_stopped_answer_is_never_stored(alice, alice_key, stream_store, response_cache):
    engine = install_engine(stream_store, SyntheticGenerator(tokens_per_s=20))
    try:
        body = {**GREEDY, "stream": True, "stream_options": {"resumable": True}}
        assert post("/v1/chat/completions", body, alice_key)["x-chatsite-cache"] == "miss"
        record = UsageRecord.objects.get(user=alice)
        assert post(f"/v1/streams/chatcmpl-{record.stream_id}/cancel", {}, alice_key).json()["cancelled"] is True
        assert wait_for_terminal(stream_store, record.stream_id)[-1].data["status"] == "stopped"
        lookup = response_cache_lookup(
            user_id=alice.pk, model=MODEL, prompt=GREEDY["messages"], params=GenerationParams(temperature=0)
        )
        assert lookup is not None
        assert lookup.answer is None
    finally:
        engine.stop(5)


def test_a_hit_resumes_after_last_event_id_and_is_alices_alone(alice_key, bob_key, fast_engine, response_cache):
    body = {**GREEDY, "stream": True, "stream_options": {"resumable": True}}
    full_text, _, _ = streamed(post("/v1/chat/completions", body, alice_key))
    hit = post("/v1/chat/completions", body, alice_key)
    assert hit["x-chatsite-cache"] == "hit"
    events = sse(hit)
    completion_id = json.loads(events[0][1])["id"]

    resumed, ids, _ = streamed(get(f"/v1/streams/{completion_id}", alice_key, HTTP_LAST_EVENT_ID="5"))
    # Tokens that wait together go out as one event, under the last one's id.
    assert all(int(event_id) > 5 for event_id in ids if event_id)
    assert resumed
    assert full_text[: -len(resumed)] == " ".join(SYNTHETIC_TEXT.split()[:5])
    assert streamed(get(f"/v1/streams/{completion_id}?after=0", alice_key))[0] == full_text
    # Stop works as on any finished stream; bob can neither read nor stop it.
    assert post(f"/v1/streams/{completion_id}/cancel", {}, alice_key).status_code == 200
    assert get(f"/v1/streams/{completion_id}", bob_key).status_code == 404
    assert post(f"/v1/streams/{completion_id}/cancel", {}, bob_key).status_code == 404


def test_a_refused_request_neither_hits_nor_fills_the_cache(alice, alice_key, fast_engine, response_cache):
    assert post("/v1/chat/completions", {**GREEDY, "max_tokens": 0}, alice_key).status_code == 400
    assert post("/v1/chat/completions", {**GREEDY, "max_tokens": 10**6}, alice_key).status_code == 400
    assert post("/v1/chat/completions", b"{not json", alice_key).status_code == 400
    assert post("/v1/chat/completions", GREEDY, None).status_code == 401
    assert not UsageRecord.objects.filter(user=alice).exists()
    assert post("/v1/chat/completions", GREEDY, alice_key)["x-chatsite-cache"] == "miss"


def test_an_unreadable_entry_is_a_miss(alice_key, fast_engine, response_cache):
    assert CachedAnswer.from_entry({"pieces": [1], "finish_reason": "stop", "completion_tokens": 1}) is None
    assert CachedAnswer.from_entry({"pieces": ["a"], "finish_reason": "cancelled", "completion_tokens": 1}) is None
    assert CachedAnswer.from_entry("junk") is None


def test_a_chat_answer_from_cache_equals_the_first_and_says_so_after_a_reload(
    alice, alice_client, fast_engine, response_cache
):
    conversation = Conversation.objects.create(user=alice, model=MODEL, temperature=0.0, max_tokens=8)
    _, first = message_send(conversation=conversation, prompt="Name a river.")
    wait_for_terminal(fast_engine.store, first.stream_id)
    second = message_regenerate(answer=Message.objects.get(pk=first.pk))
    events = wait_for_terminal(fast_engine.store, second.stream_id)

    first.refresh_from_db()
    second.refresh_from_db()
    assert not first.from_cache
    assert second.from_cache
    assert second.content == first.content
    assert second.status == "complete"
    assert "".join(e.data["delta"] for e in events if e.type == "token") == first.content
    page = alice_client.get(conversation.get_absolute_url()).content.decode()
    assert page.count('data-role="from-cache"') == 1


def test_the_usage_admin_shows_the_days_hit_rate(admin_client, alice_key, fast_engine, response_cache):
    for _ in range(4):
        post("/v1/chat/completions", GREEDY, alice_key)
    post("/v1/chat/completions", {**GREEDY, "temperature": 0.7}, alice_key)  # not cacheable: not counted
    usage_rollup()
    page = admin_client.get("/admin/accounts/usagerecord/daily/").content.decode()
    assert page.count('<td data-role="hit-rate">75% (3 of 4)</td>') == 2  # today and the total
    listing = admin_client.get("/admin/accounts/usagerecord/?cache__exact=hit").content.decode()
    assert listing.count("field-cache") == 3, re.findall(r"<tr.{0,300}", listing)[:3]


def test_bob_cannot_see_the_hit_rate_page(bob_client):
    assert bob_client.get("/admin/accounts/usagerecord/daily/").status_code == 302


def test_a_client_without_a_key_gets_no_cache_header(fast_engine, response_cache):
    response = Client().post("/v1/chat/completions", json.dumps(GREEDY), content_type="application/json")
    assert response.status_code == 401
    assert not response.has_header("x-chatsite-cache")
