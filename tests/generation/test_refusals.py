"""Requests that cannot run, or must not, are refused at the door and never hurt another user's."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from redis.exceptions import ConnectionError as RedisConnectionError

from accounts.models import Account, UsageRecord
from accounts.services import account_for, api_key_create
from api import endpoint as api_endpoint
from generation import services
from generation.models import Conversation, Message
from inference.generators import GenerationParams, SyntheticGenerator
from tests.support.api_client import CHAT, MODEL, assert_error, get, post
from tests.support.engines import install_engine, wait_for_terminal
from tests.support.sockets import ORIGIN, socket
from tests.support.streams import session_headers

pytestmark = pytest.mark.django_db(transaction=True)

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def alice_key(alice) -> str:
    return api_key_create(user=alice, name="test")[1]


def plan(user, **limits) -> None:
    Account.objects.filter(pk=account_for(user).pk).update(**limits)


def words(count: int) -> str:
    return " ".join(["word"] * count)


# -- a prompt that cannot run ------------------------------------------------------------


def test_an_empty_prompt_is_400_while_another_users_streams_run_on(alice, alice_key, bob, real_engine, stream_store):
    bobs = [
        services.generation_start(
            user=bob,
            channel=UsageRecord.Channel.API,
            model=MODEL,
            prompt=[{"role": "user", "content": prompt}],
            params=GenerationParams(max_tokens=40, temperature=0),
            requested_max_tokens=40,
        ).stream_id
        for prompt in ("Why is the sky blue?", "Explain photosynthesis.")
    ]

    response = post("/v1/completions", {"model": MODEL, "prompt": "", "max_tokens": 5}, alice_key)

    error = assert_error(response, 400, None, "prompt")
    assert "empty" in error["message"]
    assert error["type"] == "invalid_request_error"
    assert not UsageRecord.objects.filter(user=alice).exists()
    for stream_id in bobs:
        assert wait_for_terminal(stream_store, stream_id, timeout=120)[-1].type == "done"
    records = list(UsageRecord.objects.filter(user=bob))
    assert [r.status for r in records] == ["complete", "complete"]
    assert all(r.completion_tokens > 0 for r in records)


# -- tokens reserved at admission --------------------------------------------------------


def test_a_prompt_bigger_than_the_days_budget_is_insufficient_quota_and_records_nothing(alice, alice_key, fast_engine):
    plan(alice, tokens_per_day=300)
    body = {**CHAT, "messages": [{"role": "user", "content": words(2000)}], "max_tokens": 10}

    response = post("/v1/chat/completions", body, alice_key)

    error = assert_error(response, 429, "insufficient_quota")
    assert "2000 tokens" in error["message"]
    assert not UsageRecord.objects.filter(user=alice).exists()


def test_the_prompt_and_max_tokens_are_reserved_then_settled_to_the_real_figures(alice, alice_key, stream_store):
    # 0.6 s for its 3 words: the first answer still streams when the second request comes,
    # also on a loaded machine, where the test client alone takes a tenth of a second.
    engine = install_engine(stream_store, SyntheticGenerator(tokens_per_s=5, answer_words=3))
    plan(alice, tokens_per_day=300)
    body = {**CHAT, "messages": [{"role": "user", "content": words(200)}], "max_tokens": 50, "stream": True}
    response = post("/v1/chat/completions", body, alice_key)
    record = UsageRecord.objects.get(user=alice)

    assert (record.status, record.prompt_tokens, record.reserved_tokens) == ("streaming", 200, 50)
    assert response["x-ratelimit-remaining-tokens"] == "50"
    # A second request finds only 50 tokens left: its 60-token prompt doesn't fit.
    second = {**CHAT, "messages": [{"role": "user", "content": words(60)}]}
    assert_error(post("/v1/chat/completions", second, alice_key), 429, "insufficient_quota")

    b"".join(response)  # read to the end: the answer is 3 words
    wait_for_terminal(stream_store, record.stream_id)
    record.refresh_from_db()
    assert (record.status, record.prompt_tokens, record.completion_tokens, record.reserved_tokens) == (
        "complete",
        200,
        3,
        0,
    )
    engine.stop(5)


def test_the_day_budget_caps_max_tokens_after_the_prompt(alice, alice_key, fast_engine):
    plan(alice, tokens_per_day=300)
    body = {**CHAT, "messages": [{"role": "user", "content": words(295)}], "max_tokens": 100}
    answer = post("/v1/chat/completions", body, alice_key).json()
    assert answer["usage"] == {"prompt_tokens": 295, "completion_tokens": 5, "total_tokens": 300}


def test_the_real_tokenizer_counts_the_prompt_once_at_admission(alice, alice_key, real_engine, smollm):
    body = {**CHAT, "max_tokens": 3, "temperature": 0}
    answer = post("/v1/chat/completions", body, alice_key).json()
    record = UsageRecord.objects.get(user=alice)
    assert record.prompt_tokens == smollm.count_prompt_tokens(CHAT["messages"]) == answer["usage"]["prompt_tokens"]


def test_a_chat_send_beyond_the_days_budget_is_refused_before_anything_is_saved(alice, alice_client, fast_engine):
    plan(alice, tokens_per_day=5)

    response = alice_client.post(reverse("generation:chat"), {"prompt": words(10)}, **HTMX)

    assert response.status_code == 429
    assert "prompt is 10 tokens" in response.content.decode()
    assert not Conversation.objects.exists()
    assert not UsageRecord.objects.exists()


def test_the_rate_limit_is_checked_before_the_prompt_is_tokenized(alice, alice_key, fast_engine, monkeypatch):
    plan(alice, requests_per_minute=1)
    assert post("/v1/chat/completions", CHAT, alice_key).status_code == 200
    counted = []
    count = fast_engine.generator.count_prompt_tokens
    monkeypatch.setattr(fast_engine.generator, "count_prompt_tokens", lambda p: counted.append(p) or count(p))

    big = {**CHAT, "messages": [{"role": "user", "content": words(100_000)}]}
    assert_error(post("/v1/chat/completions", big, alice_key), 429, "rate_limit_exceeded")
    assert counted == []


# -- the context length, before any expensive work, on every channel ---------------------


@pytest.fixture
def short_context(fast_engine, monkeypatch):
    monkeypatch.setattr(fast_engine.generator, "context_length", 10)
    return fast_engine


def test_a_chat_prompt_beyond_the_context_is_refused_in_words_and_saves_nothing(alice, alice_client, short_context):
    response = alice_client.post(reverse("generation:chat"), {"prompt": words(20)}, **HTMX)

    assert response.status_code == 422
    assert "maximum context length is 10 tokens" in response.content.decode()
    assert words(20) in response.content.decode()  # the prompt stays in the box
    assert not Conversation.objects.exists()
    assert not UsageRecord.objects.exists()


def test_a_regenerate_beyond_the_context_is_refused_and_keeps_the_answer(alice, alice_client, fast_engine, monkeypatch):
    conversation = services.conversation_create(user=alice)
    _, answer = services.message_send(conversation=conversation, prompt="Hello")
    wait_for_terminal(fast_engine.store, answer.stream_id)
    monkeypatch.setattr(fast_engine.generator, "context_length", 1)  # "Hello" fills it

    response = alice_client.post(reverse("generation:message_regenerate", args=[answer.pk]), **HTMX)

    assert response.status_code == 422
    assert "maximum context length" in response.content.decode()
    assert list(Message.objects.filter(role="assistant")) == [answer]


async def test_a_socket_prompt_beyond_the_context_gets_an_error_and_the_socket_stays_open(
    alice, alice_client, short_context
):
    conversation = await Conversation.objects.acreate(user=alice, model=MODEL)
    communicator = socket(conversation.id, [*session_headers(alice_client), ORIGIN])
    assert (await communicator.connect())[0]

    await communicator.send_json_to({"type": "generate", "prompt": words(20)})
    error = await communicator.receive_json_from(timeout=5)
    assert error["type"] == "error"
    assert error["code"] == "context_length_exceeded"

    await communicator.send_json_to({"type": "generate", "prompt": "Hi"})
    assert (await communicator.receive_json_from(timeout=5))["type"] == "started"
    await communicator.disconnect()
    assert not await UsageRecord.objects.filter(status="error").aexists()


async def test_a_socket_prompt_that_is_not_unicode_gets_an_error_and_the_socket_stays_open(
    alice, alice_client, fast_engine
):
    conversation = await Conversation.objects.acreate(user=alice, model=MODEL)
    communicator = socket(conversation.id, [*session_headers(alice_client), ORIGIN])
    assert (await communicator.connect())[0]

    await communicator.send_to(text_data='{"type": "generate", "prompt": "\\ud800"}')
    error = await communicator.receive_json_from(timeout=5)
    assert error["type"] == "error"
    assert "not valid Unicode" in error["message"]

    await communicator.send_json_to({"type": "generate", "prompt": "Hi"})
    assert (await communicator.receive_json_from(timeout=5))["type"] == "started"
    await communicator.disconnect()
    prompts = [m async for m in Message.objects.filter(role="user").values_list("content", flat=True)]
    assert prompts == ["Hi"]


def test_an_api_prompt_that_is_not_unicode_is_400(alice_key, fast_engine):
    raw = json.dumps(CHAT).replace("Hello", "\\ud800")  # JSON's escape of a lone surrogate
    assert_error(post("/v1/chat/completions", raw, alice_key), 400, None)


# -- numbers out of range ----------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seed", 2**64),
        ("seed", 2**63),
        ("seed", -(2**63) - 1),
        ("max_tokens", 2**31),
        ("max_tokens", -1),
        ("temperature", 1e308 * 10),
        ("top_p", 1.5),
    ],
)
def test_numbers_out_of_range_are_400_naming_the_field(alice, alice_key, fast_engine, path, field, value):
    body = {"model": MODEL, "messages": CHAT["messages"]} if "chat" in path else {"model": MODEL, "prompt": "Hi"}
    error = assert_error(post(path, {**body, field: value}, alice_key), 400, None, field)
    assert error["message"].startswith(field)
    assert not UsageRecord.objects.filter(user=alice).exists()


@pytest.mark.parametrize("seed", [2**63 - 1, -(2**63)])
def test_seeds_at_the_ends_of_the_range_generate(alice_key, fast_engine, seed):
    body = {**CHAT, "seed": seed, "temperature": 0.7, "max_tokens": 2}
    assert post("/v1/chat/completions", body, alice_key).json()["usage"]["completion_tokens"] == 2


def test_the_openapi_document_gives_every_number_its_range(client):
    schemas = client.get("/v1/openapi.json").json()["components"]["schemas"]
    numbers = {
        name: next(option for option in field.get("anyOf", [field]) if option.get("type") in ("integer", "number"))
        for name, field in schemas["ChatCompletionRequest"]["properties"].items()
        if any(option.get("type") in ("integer", "number") for option in field.get("anyOf", [field]))
    }
    assert set(numbers) >= {"seed", "max_tokens", "max_completion_tokens", "temperature", "top_p"}
    for name, schema in numbers.items():
        bounded = ("minimum" in schema or "exclusiveMinimum" in schema) and "maximum" in schema
        assert bounded or "const" in schema, name


@pytest.mark.parametrize("after", [str(2**63), "-1", "1e3"])
def test_a_resume_point_out_of_range_is_400(alice, alice_key, fast_engine, after):
    completion = post("/v1/chat/completions", CHAT, alice_key).json()
    assert_error(get(f"/v1/streams/{completion['id']}?after={after}", alice_key), 400, None, "after")


def test_a_message_id_beyond_the_integer_range_is_404(alice_client):
    response = alice_client.post(f"/chat/messages/{2**70}/stop/", **HTMX)
    assert response.status_code == 404


# -- refused browser sends leave nothing behind ------------------------------------------


def test_a_refused_new_chat_creates_no_conversation_at_all(alice, alice_client, fast_engine):
    plan(alice, max_concurrent_streams=0)

    with CaptureQueriesContext(connection) as queries:
        response = alice_client.post(reverse("generation:chat"), {"prompt": "Hello"}, **HTMX)

    assert response.status_code == 429
    assert response["Retry-After"]
    assert not any("generation_conversation" in q["sql"] and q["sql"].startswith("INSERT") for q in queries)
    assert not Conversation.objects.exists()


def test_the_sidebar_is_one_query_however_many_conversations(alice, alice_client):
    for n in range(5):
        Conversation.objects.create(user=alice, model=MODEL, title=f"Chat {n}")

    with CaptureQueriesContext(connection) as queries:
        page = alice_client.get(reverse("generation:chat")).content.decode()

    assert sum("generation_conversation" in q["sql"] for q in queries) == 1
    assert all(f"Chat {n}" in page for n in range(5))


def test_an_unreachable_redis_is_a_503_to_retry_not_a_500(alice, alice_key, fast_engine, monkeypatch):
    def unreachable(**kwargs):
        raise RedisConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(api_endpoint, "generation_start", unreachable)
    monkeypatch.setattr(api_endpoint, "quota_reported", lambda *args, **kwargs: unreachable())

    response = post("/v1/chat/completions", CHAT, alice_key)

    assert_error(response, 503, "server_overloaded")
    assert int(response["Retry-After"]) > 0
    assert "x-ratelimit-limit-requests" not in response  # the counters were out of reach
