"""POST /v1/embeddings through Django's test client, with the packaged embedding model
(the official openai client runs in tests/e2e/test_embeddings_live.py)."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from accounts.models import Account, Plan, UsageRecord
from accounts.services import account_for, api_key_create
from generation import services
from inference.embedding import available_embedding_models
from tests.support.api_client import CHAT, MODEL, RATE_HEADERS, assert_error, get, post

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("all-minilm-l6-v2" not in available_embedding_models(), reason="model package not installed"),
]

EMBEDDER = "all-minilm-l6-v2"


@pytest.fixture
def alice_key(alice) -> str:
    return api_key_create(user=alice, name="test")[1]


def embed(key: str, **body: object):
    return post("/v1/embeddings", {"model": EMBEDDER, **body}, key)


def vector(item: dict) -> np.ndarray:
    embedding = item["embedding"]
    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding), dtype="<f4")
    return np.array(embedding, dtype=np.float32)


def test_a_text_gets_one_unit_vector_of_384_numbers_and_its_usage(alice_key):
    response = embed(alice_key, input="The tide comes in twice a day.")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["object"] == "list"
    assert body["model"] == EMBEDDER
    [item] = body["data"]
    assert (item["object"], item["index"]) == ("embedding", 0)
    assert len(item["embedding"]) == 384
    assert abs(np.linalg.norm(vector(item)) - 1) < 1e-4
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 2
    assert all(response.has_header(name) for name in RATE_HEADERS)


def test_base64_is_the_same_vectors_as_float32_little_endian_bytes(alice_key):
    texts = ["A man is eating food.", "A man is eating a piece of bread.", "The sky is blue."]

    floats = embed(alice_key, input=texts).json()["data"]
    packed = embed(alice_key, input=texts, encoding_format="base64").json()["data"]

    assert [item["index"] for item in packed] == [0, 1, 2]
    assert all(isinstance(item["embedding"], str) for item in packed)
    for a, b in zip(floats, packed, strict=True):
        assert np.allclose(vector(a), vector(b), atol=1e-6)
    eating, bread, sky = (vector(item) for item in floats)
    assert eating @ bread > 0.6 > 0.2 > eating @ sky  # similar meaning, similar vectors


def test_the_models_own_dimensions_are_accepted_and_others_refused(alice_key):
    assert embed(alice_key, input="hello", dimensions=384).status_code == 200

    error = assert_error(embed(alice_key, input="hello", dimensions=256), 400, None, "dimensions")
    assert "384" in error["message"]


@pytest.mark.parametrize(
    "sent",
    [[1, 2, 3], [[1, 2], [3]], [], "", ["fine", ""], ["text", 7], None],
    ids=["token-ids", "token-id-lists", "no-texts", "empty-text", "one-empty", "mixed", "null"],
)
def test_inputs_that_are_not_texts_are_refused_naming_input(alice_key, sent):
    assert_error(embed(alice_key, input=sent), 400, None, "input")


def test_token_ids_are_refused_with_the_reason(alice_key):
    error = assert_error(embed(alice_key, input=[101, 2023, 102]), 400, None, "input")
    assert "Token ids are not taken" in error["message"]


def test_an_input_over_256_tokens_is_refused_as_too_long_and_not_recorded(alice, alice_key):
    error = assert_error(embed(alice_key, input=["short", "word " * 300]), 400, "context_length_exceeded", "input")

    assert "Input 1" in error["message"]
    assert not UsageRecord.objects.filter(user=alice).exists()


def test_unknown_models_are_404_and_a_chat_model_is_sent_to_its_endpoint(alice_key):
    assert_error(
        post("/v1/embeddings", {"model": "text-embedding-3-small", "input": "x"}, alice_key), 404, "model_not_found"
    )
    error = assert_error(post("/v1/embeddings", {"model": MODEL, "input": "x"}, alice_key), 400, None, "model")
    assert "chat model" in error["message"]


def test_a_chat_completion_with_the_embedding_model_is_refused_clearly(alice_key):
    error = assert_error(post("/v1/chat/completions", {**CHAT, "model": EMBEDDER}, alice_key), 400, None, "model")
    assert "/v1/embeddings" in error["message"]


def test_models_lists_chat_and_embedding_models_with_their_kind(alice_key):
    data = get("/v1/models", alice_key).json()["data"]

    kinds = {model["id"]: model["kind"] for model in data}
    assert kinds[MODEL] == "chat"
    assert kinds[EMBEDDER] == "embedding"
    assert all(set(model) == {"id", "object", "created", "owned_by", "kind"} for model in data)


def test_the_chat_forms_never_offer_the_embedding_model(alice):
    assert EMBEDDER not in services.models_to_choose(alice)
    assert services.models_for(user=alice, kind="embedding") == [EMBEDDER]


def test_a_plan_without_the_embedding_model_neither_lists_nor_serves_it(alice, alice_key):
    Plan.objects.filter(pk=account_for(alice).plan_id).update(allowed_models=[MODEL])

    assert EMBEDDER not in [model["id"] for model in get("/v1/models", alice_key).json()["data"]]
    assert_error(embed(alice_key, input="hello"), 404, "model_not_found")


def test_a_key_narrowed_to_a_chat_model_cannot_embed(alice):
    key = api_key_create(user=alice, name="chat only", allowed_models=[MODEL])[1]

    assert_error(embed(key, input="hello"), 404, "model_not_found")


def test_each_request_is_one_settled_record_in_the_callers_ledger(alice, bob, alice_key):
    bob_key = api_key_create(user=bob, name="bob")[1]

    usage = embed(alice_key, input=["one", "two words"]).json()["usage"]
    embed(bob_key, input="bob's")

    record = UsageRecord.objects.get(user=alice)
    assert (record.channel, record.model, record.status) == ("api", EMBEDDER, "complete")
    assert record.api_key is not None and record.api_key.user == alice
    assert (record.prompt_tokens, record.completion_tokens, record.reserved_tokens) == (usage["prompt_tokens"], 0, 0)
    assert account_for(alice).ledger_day_tokens == usage["prompt_tokens"]
    assert UsageRecord.objects.filter(user=bob).count() == 1


def test_the_days_token_budget_refuses_inputs_beyond_it(alice, alice_key):
    Account.objects.filter(pk=account_for(alice).pk).update(tokens_per_day=10)

    assert embed(alice_key, input="short").status_code == 200  # 3 tokens
    response = embed(alice_key, input="a somewhat longer sentence that takes more than the rest of the day")

    assert_error(response, 429, "insufficient_quota")
    assert response["Retry-After"]


def test_the_per_minute_limit_counts_embedding_requests(alice, alice_key):
    Account.objects.filter(pk=account_for(alice).pk).update(requests_per_minute=1)

    assert embed(alice_key, input="first").status_code == 200
    assert_error(embed(alice_key, input="second"), 429, "rate_limit_exceeded")


def test_without_a_key_it_is_401(alice_key):
    assert_error(post("/v1/embeddings", {"model": EMBEDDER, "input": "x"}, None), 401, "invalid_api_key")
