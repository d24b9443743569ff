"""vLLM's /tokenize and /detokenize, with the real packaged model's tokenizer.

Both sit at the site's root, as on vLLM, and answer like the rest of the API: the same keys,
the same error object, the same X-Request-Id. They generate nothing and count against no plan.
"""

from __future__ import annotations

import json

import pytest
from django.conf import settings as django_settings
from django.test import Client

from accounts.models import ApiKey
from accounts.services import account_for, api_key_create
from api.schemas import MAX_DETOKENIZE_TOKENS, MAX_TOKENIZE_CHARS
from chatsite.body_limit import refusal
from generation.backends import runtime
from generation.backends.router import InProcessBackend
from inference.engine import EngineOverloaded
from inference.generators import SyntheticGenerator
from tests.support.api_client import MODEL, RATE_HEADERS, assert_error, get, post
from tests.support.engines import install_engine

pytestmark = pytest.mark.django_db(transaction=True)

TEXT = "Hello, world! Ünïcödé and emoji 😀 survive the round trip."
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture
def alice_key(alice) -> str:
    return api_key_create(user=alice, name="test")[1]


@pytest.fixture
def bob_key(bob) -> str:
    return api_key_create(user=bob, name="test")[1]


@pytest.fixture
def models(settings, stream_store, real_engine):
    """The real SmolLM2 under its name, and the synthetic model, which has no tokenizer."""
    settings.CHAT_ENABLE_SYNTHETIC = True
    synthetic = install_engine(stream_store, SyntheticGenerator(tokens_per_s=1000))
    engines = runtime.current().engines
    engines["synthetic"] = synthetic  # install_engine files it under CHAT_MODEL
    engines[django_settings.CHAT_MODEL] = real_engine
    yield real_engine.generator
    synthetic.stop(timeout=10)


def tokenize(body: dict, key: str | None, **headers: str):
    return post("/tokenize", {"model": MODEL, **body}, key, **headers)


def detokenize(tokens: list, key: str | None, **headers: str):
    return post("/detokenize", {"model": MODEL, "tokens": tokens}, key, **headers)


# -- what they answer ------------------------------------------------------------------------


def test_a_prompt_tokenized_then_detokenized_comes_back_unchanged(alice_key, models):
    response = tokenize({"prompt": TEXT}, alice_key)

    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == {"count", "max_model_len", "tokens"}
    assert body["tokens"] == models.tokenizer(TEXT)["input_ids"]
    assert body["count"] == len(body["tokens"]) > 5
    assert body["max_model_len"] == models.context_length == 8192
    back = detokenize(body["tokens"], alice_key)
    assert back.status_code == 200, back.content
    assert back.json() == {"prompt": TEXT}


def test_a_chat_is_tokenized_as_its_chat_template_renders_it(alice_key, models):
    body = tokenize({"messages": CHAT}, alice_key).json()

    expected = models.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert body["tokens"] == models.tokenizer(expected, add_special_tokens=False)["input_ids"]
    assert body["count"] == len(body["tokens"])
    # What a chat completion counts as its prompt_tokens, and its text with the special tokens.
    assert body["count"] == models.count_prompt_tokens(CHAT)
    prompt = detokenize(body["tokens"], alice_key).json()["prompt"]
    assert prompt == expected
    assert prompt.endswith("<|im_start|>assistant\n")


def test_a_chat_without_the_generation_prompt_or_continuing_its_last_message(alice_key, models):
    with_prompt = tokenize({"messages": CHAT}, alice_key).json()["tokens"]
    without = tokenize({"messages": CHAT, "add_generation_prompt": False}, alice_key).json()["tokens"]
    answer = [*CHAT, {"role": "assistant", "content": "It is"}]
    continued = tokenize({"messages": answer, "continue_final_message": True}, alice_key).json()["tokens"]

    assert with_prompt[: len(without)] == without
    assert len(with_prompt) > len(without)
    assert detokenize(continued, alice_key).json()["prompt"].endswith("<|im_start|>assistant\nIt is")


def test_continuing_the_last_message_and_adding_a_generation_prompt_is_400(alice_key, models):
    body = {"messages": CHAT, "continue_final_message": True, "add_generation_prompt": True}
    error = assert_error(tokenize(body, alice_key), 400, None)
    assert "continue_final_message" in error["message"]


def test_token_strings_on_request(alice_key, models):
    body = tokenize({"prompt": "Hello world", "return_token_strs": True}, alice_key).json()
    assert body["token_strs"] == models.tokenizer.convert_ids_to_tokens(body["tokens"])
    assert len(body["token_strs"]) == body["count"]


def test_an_empty_prompt_has_no_tokens_and_no_tokens_make_an_empty_prompt(alice_key, models):
    assert tokenize({"prompt": ""}, alice_key).json()["tokens"] == []
    assert detokenize([], alice_key).json() == {"prompt": ""}


def test_special_tokens_are_detokenized_as_text(alice_key, models):
    end = models.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert detokenize([end], alice_key).json() == {"prompt": "<|im_end|>"}


def test_tokenizing_counts_against_no_plan(alice_key, models):
    before = get("/v1/usage", alice_key).json()
    for _ in range(3):
        response = tokenize({"prompt": TEXT}, alice_key)
        assert all(response.has_header(name) for name in RATE_HEADERS)
        assert detokenize([1, 2], alice_key).status_code == 200
    after = get("/v1/usage", alice_key).json()
    assert after["requests"]["used"] == before["requests"]["used"]
    assert after["tokens"]["used"] == before["tokens"]["used"]


def test_the_request_id_is_answered_as_elsewhere_in_the_api(alice_key, models):
    response = tokenize({"prompt": "Hi"}, alice_key, HTTP_X_REQUEST_ID="req-alice-1")
    assert response["X-Request-Id"] == "req-alice-1"
    assert detokenize([1], None)["X-Request-Id"]


# -- who may --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
@pytest.mark.parametrize("header", [{}, {"HTTP_AUTHORIZATION": "Bearer cs-nope"}, {"HTTP_AUTHORIZATION": "Basic x"}])
def test_a_missing_or_wrong_key_is_401(models, path, header):
    body = {"model": MODEL, "prompt": "Hi", "tokens": [1]}
    body.pop("tokens" if path == "/tokenize" else "prompt")
    response = post(path, body, None, **header)
    assert_error(response, 401, "invalid_api_key")
    assert response["X-Request-Id"]


def test_a_revoked_key_is_401(alice, models):
    key, plain = api_key_create(user=alice, name="old")
    key.revoke()
    assert_error(tokenize({"prompt": "Hi"}, plain), 401, "invalid_api_key")
    assert_error(detokenize([1], plain), 401, "invalid_api_key")


def test_the_x_api_key_header_works_too(alice_key, models):
    assert tokenize({"prompt": "Hi"}, None, HTTP_X_API_KEY=alice_key).status_code == 200


def test_an_unknown_model_is_404_model_not_found(alice_key, models):
    for response in (
        post("/tokenize", {"model": "gpt-9", "prompt": "Hi"}, alice_key),
        post("/detokenize", {"model": "gpt-9", "tokens": [1]}, alice_key),
    ):
        error = assert_error(response, 404, "model_not_found", "model")
        assert error["message"] == "The model 'gpt-9' does not exist."


def test_bob_is_refused_a_model_alice_may_use_exactly_as_one_that_does_not_exist(alice_key, bob, bob_key, models):
    account = account_for(bob)
    account.allowed_models = ["synthetic"]
    account.save()

    assert tokenize({"prompt": "Hi"}, alice_key).status_code == 200
    error = assert_error(tokenize({"prompt": "Hi"}, bob_key), 404, "model_not_found", "model")
    assert error["message"] == f"The model {MODEL!r} does not exist."
    assert_error(detokenize([1], bob_key), 404, "model_not_found", "model")


def test_a_key_narrowed_to_other_models_is_refused_this_one(alice, models):
    key, plain = api_key_create(user=alice, name="narrow")
    ApiKey.objects.filter(pk=key.pk).update(allowed_models=["synthetic"])
    assert_error(tokenize({"prompt": "Hi"}, plain), 404, "model_not_found", "model")


def test_a_model_without_a_tokenizer_is_400_saying_so(alice_key, models):
    for response in (
        post("/tokenize", {"model": "synthetic", "prompt": "Hi"}, alice_key),
        post("/detokenize", {"model": "synthetic", "tokens": [1]}, alice_key),
    ):
        error = assert_error(response, 400, None, "model")
        assert error["message"] == "The model 'synthetic' has no tokenizer."


def test_a_model_still_loading_is_503_with_retry_after(alice_key, models, monkeypatch):
    def loading(self, model):
        raise EngineOverloaded("the model is not loaded (loading)")

    monkeypatch.setattr(InProcessBackend, "tokenizer", loading)
    response = tokenize({"prompt": "Hi"}, alice_key)
    assert_error(response, 503, "server_overloaded")
    assert response["Retry-After"]


def test_a_model_without_a_chat_template_takes_prompts_only(alice_key, models, monkeypatch):
    monkeypatch.setattr(models.tokenizer, "chat_template", None)
    error = assert_error(tokenize({"messages": CHAT}, alice_key), 400, None, "messages")
    assert "no chat template" in error["message"]
    assert tokenize({"prompt": "Hi"}, alice_key).status_code == 200


def test_messages_the_chat_template_refuses_are_400(alice_key, models, monkeypatch):
    monkeypatch.setattr(models.tokenizer, "chat_template", "{{ raise_exception('Roles must alternate') }}")
    error = assert_error(tokenize({"messages": CHAT}, alice_key), 400, None, "messages")
    assert "Roles must alternate" in error["message"]


# -- bad input: a 400 with the error object, never a 500 -------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", b"{not json", None),
        ("/tokenize", b"[]", None),
        ("/tokenize", {"model": MODEL}, "prompt"),
        ("/tokenize", {"prompt": "Hi"}, "model"),
        ("/tokenize", {"model": MODEL, "prompt": 5}, "prompt"),
        ("/tokenize", {"model": MODEL, "prompt": ["Hi"]}, "prompt"),
        ("/tokenize", {"model": MODEL, "prompt": "Hi", "add_special_tokens": "yes"}, "add_special_tokens"),
        ("/tokenize", {"model": MODEL, "prompt": "Hi", "max_tokens": 5}, "max_tokens"),
        ("/tokenize", {"model": MODEL, "prompt": "Hi", "messages": CHAT}, "prompt"),
        ("/tokenize", {"model": MODEL, "messages": []}, "messages"),
        ("/tokenize", {"model": MODEL, "messages": [{"role": "robot", "content": "Hi"}]}, "messages.0.role"),
        ("/tokenize", {"model": MODEL, "messages": "Hi"}, "messages"),
        ("/detokenize", b"{not json", None),
        ("/detokenize", {"model": MODEL}, "tokens"),
        ("/detokenize", {"model": MODEL, "tokens": "1 2 3"}, "tokens"),
        ("/detokenize", {"model": MODEL, "tokens": [1, "2"]}, "tokens.1"),
        ("/detokenize", {"model": MODEL, "tokens": [1.5]}, "tokens.0"),
        ("/detokenize", {"model": MODEL, "tokens": [True]}, "tokens.0"),
        ("/detokenize", {"model": MODEL, "tokens": [-1]}, "tokens.0"),
        ("/detokenize", {"model": MODEL, "tokens": [2**40]}, "tokens.0"),
        ("/detokenize", {"model": MODEL, "tokens": [2**70]}, "tokens.0"),
        ("/detokenize", {"model": MODEL, "tokens": [1], "prompt": "Hi"}, "prompt"),
    ],
)
def test_malformed_bodies_are_400_naming_the_field(alice_key, models, path, body, param):
    error = assert_error(post(path, body, alice_key), 400, None)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


def test_a_token_id_beyond_the_vocabulary_is_400(alice_key, models):
    size = len(models.tokenizer)
    assert detokenize([size - 1], alice_key).status_code == 200
    error = assert_error(detokenize([1, size], alice_key), 400, None, "tokens")
    assert f"Token id {size} is not in the model's vocabulary" in error["message"]


def test_an_integer_written_with_a_decimal_point_is_a_token_id(alice_key, models):
    assert detokenize([9690.0], alice_key).json() == detokenize([9690], alice_key).json()


def test_input_beyond_the_caps_is_400(alice_key, models):
    long = "a" * (MAX_TOKENIZE_CHARS + 1)
    assert_error(tokenize({"prompt": long}, alice_key), 400, None, "prompt")
    halves = [{"role": "user", "content": long[: len(long) // 2]}, {"role": "user", "content": long[len(long) // 2 :]}]
    assert_error(tokenize({"messages": halves}, alice_key), 400, None, "messages")
    assert_error(detokenize([1] * (MAX_DETOKENIZE_TOKENS + 1), alice_key), 400, None, "tokens")


def test_input_at_the_caps_is_answered(alice_key, models):
    assert detokenize([1] * MAX_DETOKENIZE_TOKENS, alice_key).status_code == 200
    assert tokenize({"prompt": "word " * (MAX_TOKENIZE_CHARS // 5)}, alice_key).json()["count"] > 50_000


def test_a_body_over_the_size_allowed_is_a_413_error_object(alice_key, models, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    assert_error(tokenize({"prompt": "a" * 2000}, alice_key), 413, "request_too_large")
    assert_error(detokenize([1] * 1000, alice_key), 413, "request_too_large")


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_another_method_is_405_with_allow_before_any_key_check(alice_key, path, method):
    for key in (alice_key, None):
        headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
        response = getattr(Client(), method.lower())(path, **headers)
        error = assert_error(response, 405, None)
        assert response["Allow"] == "POST"
        assert path in error["message"]


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
def test_a_body_refused_before_it_is_read_gets_the_api_error_object(path):
    content_type, body = refusal(path, 1000)
    assert content_type == b"application/json"
    assert json.loads(body)["error"]["code"] == "request_too_large"


def test_what_django_refuses_on_these_paths_is_the_api_error_object(alice_key):
    response = Client().post("/tokenize", "{}", content_type="application/json", HTTP_HOST="evil.example")
    assert_error(response, 400, None)
    assert response["Content-Type"] == "application/json"


# -- the document ---------------------------------------------------------------------------


def test_the_openapi_document_describes_both_at_the_sites_root(client):
    document = client.get("/v1/openapi.json").json()
    schemas = document["components"]["schemas"]
    tokenize_op, detokenize_op = document["paths"]["/tokenize"]["post"], document["paths"]["/detokenize"]["post"]

    assert tokenize_op["servers"] == detokenize_op["servers"] == [{"url": "/"}]
    forms = tokenize_op["requestBody"]["content"]["application/json"]["schema"]["oneOf"]
    assert {form["$ref"].rsplit("/", 1)[1] for form in forms} == {"TokenizeCompletionRequest", "TokenizeChatRequest"}
    assert schemas["TokenizeResponse"]["required"] == ["count", "max_model_len", "tokens"]
    assert schemas["DetokenizeRequest"]["properties"]["tokens"]["maxItems"] == MAX_DETOKENIZE_TOKENS
    assert schemas["TokenizeCompletionRequest"]["properties"]["prompt"]["maxLength"] == MAX_TOKENIZE_CHARS
    assert json.dumps(schemas["TokenizeChatRequest"]["not"])  # the two endings that exclude each other
    for operation in (tokenize_op, detokenize_op):
        assert {"400", "401", "404", "405", "413", "503"} <= set(operation["responses"])
