"""The API's edges through Django's test client: OpenAI's error object for every error under
/v1/, failures told by reference only, and the request fields OpenAI documents.

Through a real daphne (chatsite.asgi.ProgramsHandler) in tests/test_api_live.py."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from accounts.models import UsageRecord
from accounts.services import api_key_create
from api import endpoint, views
from api.schemas import ChatCompletionRequest, CompletionRequest
from inference.engine import failure_message
from inference.generators import SYNTHETIC_TEXT
from inference.upstream import PASSTHROUGH_FIELDS
from tests.support.api_client import CHAT, MODEL, RATE_HEADERS, assert_error, get, post, sse
from tests.support.chat import eager_engine, fast_engine_run_eagerly

__all__ = ["eager_engine", "fast_engine_run_eagerly"]  # fixtures, used by name

pytestmark = pytest.mark.django_db

TEXT = {"model": MODEL, "prompt": "Once upon a time"}
SECRET = "secret-7f3a"
# Each documented field at a value that asks for nothing, as SDK integrations send them.
NEUTRAL = {
    "n": 1,
    "frequency_penalty": 0,
    "presence_penalty": 0.0,
    "logit_bias": {},
    "user": "user-1234",
    "seed": None,
    "stop": None,
    "stream": False,
}
NEUTRAL_CHAT = {
    **NEUTRAL,
    "logprobs": False,
    "top_logprobs": None,
    "response_format": {"type": "text"},
    "parallel_tool_calls": True,
    "tool_choice": "none",
    "store": False,
    "metadata": {"app": "tests"},
    "service_tier": "auto",
    "modalities": ["text"],
    "prompt_cache_key": "tests",
    "safety_identifier": "user-1234",
}
NEUTRAL_TEXT = {**NEUTRAL, "best_of": 1, "echo": False, "suffix": None, "logprobs": None}


@pytest.fixture
def alice_key(alice) -> str:
    return api_key_create(user=alice, name="test")[1]


def request(method: str, path: str, key: str | None = None, **headers: str):
    if key:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    return Client().generic(method, path, **headers)


def assert_api_error(response, status: int, code: str | None = None) -> dict:
    """OpenAI's error object, as JSON, with the request's id."""
    assert response["Content-Type"] == "application/json"
    assert response["X-Request-Id"]
    return assert_error(response, status, code)


# -- the error object everywhere under /v1/ -------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE", "PATCH"])
@pytest.mark.parametrize("path", ["/v1/", "/v1/nope", "/v1/models/gpt-4", "/v1/chat/completions/"])
def test_unknown_paths_under_v1_are_404_error_objects_whatever_the_method_and_key(alice_key, method, path):
    for key in (alice_key, None):
        error = assert_api_error(request(method, path, key), 404)
        assert error["type"] == "invalid_request_error"
        assert f"{method} {path}" in error["message"]


def test_pages_outside_v1_keep_their_html_errors(alice_client):
    response = alice_client.get("/no-such-page/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/v1/chat/completions", "POST"),
        ("PUT", "/v1/completions", "POST"),
        ("POST", "/v1/models", "GET"),
        ("DELETE", "/v1/usage", "GET"),
        ("POST", "/v1/streams/chatcmpl-x", "GET"),
        ("GET", "/v1/streams/chatcmpl-x/cancel", "POST"),
        ("POST", "/v1/openapi.json", "GET"),
        ("POST", "/v1/docs", "GET"),
    ],
)
def test_a_wrong_method_is_a_405_error_object_with_allow_before_any_key_check(alice_key, method, path, allowed):
    for key in (alice_key, "cs-wrong", None):
        response = request(method, path, key)
        error = assert_api_error(response, 405)
        assert response["Allow"] == allowed
        assert allowed in error["message"]


def test_an_oversized_body_is_a_413_error_object_that_starts_nothing(alice, alice_key, fast_engine, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = {**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]}
    error = assert_api_error(post("/v1/chat/completions", body, alice_key), 413, "request_too_large")
    assert "1000 bytes" in error["message"]
    assert not UsageRecord.objects.filter(user=alice).exists()


def test_a_request_without_a_key_is_refused_before_its_body_is_read(alice, fast_engine):
    assert_api_error(post("/v1/chat/completions", b"{not json", None), 401, "invalid_api_key")
    assert_api_error(post("/v1/completions", {**TEXT, "n": 5}, "cs-wrong"), 401, "invalid_api_key")


def fail_with_a_secret(**kwargs):
    raise RuntimeError(f"CUDA error: out of memory on /dev/nvidia0 ({SECRET})")


def test_an_unexpected_exception_is_a_500_naming_the_request_and_only_the_log_has_it(
    alice_key, fast_engine, monkeypatch, caplog
):
    monkeypatch.setattr(endpoint, "generation_start", fail_with_a_secret)

    response = post("/v1/chat/completions", CHAT, alice_key)

    request_id = response["X-Request-Id"]
    error = assert_api_error(response, 500)
    assert error == {"message": failure_message(request_id), "type": "server_error", "param": None, "code": None}
    assert SECRET not in response.content.decode()
    assert all(response.has_header(name) for name in RATE_HEADERS)
    logged = [r for r in caplog.records if request_id in r.getMessage()]
    assert logged
    assert logged[0].exc_info
    assert SECRET in str(logged[0].exc_info[1])


@pytest.mark.parametrize(("sent", "kept"), [("req-42.b:7", True), ("two words", False), ("x" * 129, False)])
def test_a_plain_client_request_id_is_kept_and_others_replaced(alice_key, fast_engine, sent, kept):
    response = get("/v1/models", alice_key, HTTP_X_REQUEST_ID=sent)
    assert (response["X-Request-Id"] == sent) is kept
    assert response["X-Request-Id"]


def test_a_stream_whose_reading_fails_ends_with_an_error_event_naming_the_request(
    alice_key, fast_engine, monkeypatch, caplog
):
    async def unreachable_store(store, stream_id, after):
        raise ConnectionError(f"Error 111 connecting to 10.0.0.7:6379 ({SECRET})")
        yield

    monkeypatch.setattr(views.sse, "read", unreachable_store)

    response = post("/v1/chat/completions", {**CHAT, "stream": True}, alice_key)

    events = sse(response)
    assert json.loads(events[0][1])["choices"][0]["delta"]["role"] == "assistant"
    assert json.loads(events[-2][1])["error"]["message"] == failure_message(response["X-Request-Id"])
    assert events[-1] == (None, "[DONE]")
    assert SECRET not in str(events)
    assert SECRET in caplog.text
    assert response["X-Request-Id"] in caplog.text


def failing_middleware(get_response):
    def middleware(request):
        raise RuntimeError(f"the session store is down ({SECRET})")

    return middleware


def test_what_django_refuses_around_the_api_is_an_error_object_and_a_page_elsewhere(settings, caplog):
    assert_api_error(Client().get("/v1/models", HTTP_HOST="evil.example"), 400)  # not in ALLOWED_HOSTS
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "tests.api.test_api_edges.failing_middleware"]
    client = Client(raise_request_exception=False)

    api = client.get("/v1/models")
    page = client.get("/accounts/login/")

    error = assert_api_error(api, 500)
    assert error["message"] == failure_message(api["X-Request-Id"])
    assert SECRET not in api.content.decode()
    assert page.status_code == 500
    assert page["Content-Type"].startswith("text/html")
    assert api["X-Request-Id"] in caplog.text


# -- the request fields OpenAI documents ------------------------------------------------------


@pytest.mark.parametrize("role", ["user", "system", "developer", "tool"])
def test_a_message_without_content_is_a_400_naming_the_field_and_starts_nothing(alice, alice_key, fast_engine, role):
    messages = [{"role": "user", "content": "Hello"}, {"role": role}]

    error = assert_api_error(post("/v1/chat/completions", {**CHAT, "messages": messages}, alice_key), 400)

    assert error == {
        "message": f"messages.1.content: Field required in a {role} message",
        "type": "invalid_request_error",
        "param": "messages.1.content",
        "code": None,
    }
    assert not UsageRecord.objects.filter(user=alice).exists()


def test_only_an_assistant_message_that_calls_tools_may_leave_out_its_content():
    call = {"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}
    calling = ChatCompletionRequest.model_validate_json(
        json.dumps({**CHAT, "messages": [*CHAT["messages"], {"role": "assistant", "tool_calls": [call]}]})
    )
    assert calling.messages[1].content is None
    assert calling.chat()[1]["content"] == ""
    with pytest.raises(ValueError, match="Field required in an assistant message without tool_calls"):
        ChatCompletionRequest.model_validate_json(json.dumps({**CHAT, "messages": [{"role": "assistant"}]}))


@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", CHAT), ("/v1/completions", TEXT)])
def test_documented_fields_at_their_neutral_values_are_accepted(alice_key, fast_engine, path, body):
    neutral = NEUTRAL_CHAT if path.endswith("chat/completions") else NEUTRAL_TEXT
    response = post(path, {**body, **neutral, "max_tokens": 3}, alice_key)

    assert response.status_code == 200, response.content
    choice = response.json()["choices"][0]
    assert choice.get("text", choice.get("message", {}).get("content")) == " ".join(SYNTHETIC_TEXT.split()[:3])


@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", CHAT), ("/v1/completions", TEXT)])
def test_documented_fields_sent_as_null_mean_their_defaults(alice_key, fast_engine, path, body):
    neutral = NEUTRAL_CHAT if path.endswith("chat/completions") else NEUTRAL_TEXT
    nulls = dict.fromkeys([*neutral, "temperature", "top_p", "max_tokens", "stream_options"])
    assert post(path, {**body, **nulls}, alice_key).status_code == 200


def test_neutral_values_ask_nothing_of_the_model_and_others_pass_on_to_model_servers():
    neutral = ChatCompletionRequest.model_validate_json(json.dumps({**CHAT, **NEUTRAL_CHAT}))
    assert neutral.generation_params().extra == {}
    assert (neutral.generation_params().temperature, neutral.generation_params().top_p) == (1.0, 1.0)
    asking = {"frequency_penalty": 0.5, "presence_penalty": -1.0, "logit_bias": {"198": -100}}
    for schema, body in ((ChatCompletionRequest, CHAT), (CompletionRequest, TEXT)):
        extra = schema.model_validate_json(json.dumps({**body, **asking})).generation_params().extra
        assert extra == asking
        assert set(extra) <= set(PASSTHROUGH_FIELDS)


@pytest.mark.parametrize(
    ("path", "field", "value", "param"),
    [
        ("/v1/chat/completions", "n", 2, "n"),
        ("/v1/completions", "n", 3, "n"),
        ("/v1/chat/completions", "store", True, "store"),
        ("/v1/chat/completions", "service_tier", "flex", "service_tier"),
        ("/v1/chat/completions", "modalities", ["text", "audio"], "modalities"),
        ("/v1/chat/completions", "stream_options", {"include_obfuscation": True}, "stream_options.include_obfuscation"),
        ("/v1/completions", "best_of", 2, "best_of"),
        ("/v1/completions", "echo", True, "echo"),
        ("/v1/completions", "suffix", "The end.", "suffix"),
        ("/v1/completions", "logprobs", 2, "logprobs"),
    ],
)
def test_a_value_no_model_here_honours_is_a_400_naming_the_field(
    alice, alice_key, fast_engine, path, field, value, param
):
    body = CHAT if path.endswith("chat/completions") else TEXT
    error = assert_api_error(post(path, {**body, field: value}, alice_key), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"].startswith(f"{param}: chatsite")
    assert "only" in error["message"]
    assert not UsageRecord.objects.filter(user=alice).exists()


@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", CHAT), ("/v1/completions", TEXT)])
@pytest.mark.parametrize(
    ("field", "value"), [("frequency_penalty", 0.5), ("presence_penalty", -1), ("logit_bias", {"198": -100})]
)
def test_what_only_model_servers_honour_is_a_400_naming_the_field_for_in_process_models(
    alice, alice_key, fast_engine, path, body, field, value
):
    error = assert_api_error(post(path, {**body, field: value}, alice_key), 400)
    assert error["param"] == field
    assert "does not support" in error["message"]
    assert not UsageRecord.objects.filter(user=alice).exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("frequency_penalty", 2.5),
        ("presence_penalty", "high"),
        ("logit_bias", {"token": 1}),
        ("logit_bias", {"198": 101}),
        ("n", 0),
        ("metadata", {f"k{i}": "v" for i in range(17)}),
        ("metadata", {"note": "x" * 513}),
        ("service_tier", "gold"),
        ("store", "no"),
        ("user", 42),
    ],
)
def test_documented_fields_out_of_their_range_are_400_naming_the_field(alice_key, fast_engine, field, value):
    error = assert_api_error(post("/v1/chat/completions", {**CHAT, field: value}, alice_key), 400)
    assert error["param"].startswith(field)


def test_the_openapi_document_describes_the_accepted_fields_and_the_other_errors(client):
    document = client.get("/v1/openapi.json").json()
    schemas = document["components"]["schemas"]
    chat, text = schemas["ChatCompletionRequest"]["properties"], schemas["CompletionRequest"]["properties"]
    for field in ("frequency_penalty", "presence_penalty", "logit_bias", "n", "user"):
        assert field in chat
        assert field in text
    for field in ("store", "metadata", "service_tier", "modalities", "parallel_tool_calls", "response_format"):
        assert field in chat
    for field in ("best_of", "echo", "suffix", "logprobs"):
        assert field in text
    assert "model servers" in json.dumps(chat["frequency_penalty"])
    assert chat["n"]["anyOf"][0]["enum"] == [1]
    assert "one choice" in chat["n"]["anyOf"][0]["description"]
    assert chat["service_tier"]["anyOf"][0]["enum"] == ["auto", "default"]
    assert text["logprobs"]["anyOf"][0]["type"] == "null"
    for operations in document["paths"].values():
        for operation in operations.values():
            assert operation["responses"]["default"]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/Error"
            }


# -- what the fuzzer (tests/test_api_fuzz.py) found ------------------------------------------


@pytest.mark.parametrize(("field", "value"), [("max_tokens", 3.0), ("seed", 42.0), ("n", 1.0)])
def test_an_integer_written_with_a_decimal_point_is_an_integer_as_the_document_says(
    alice_key, fast_engine, field, value
):
    """JSON Schema's "integer" takes 3.0; strict validation alone refused it."""
    response = post("/v1/chat/completions", {**CHAT, "max_tokens": 3, field: value}, alice_key)

    assert response.status_code == 200, response.content
    assert response.json()["usage"]["completion_tokens"] == 3
    error = assert_api_error(post("/v1/chat/completions", {**CHAT, "max_tokens": 3.5}, alice_key), 400)
    assert error["param"] == "max_tokens"


def test_the_document_states_the_bounds_the_server_checks(client):
    chat = client.get("/v1/openapi.json").json()["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    sequence, sequences, _ = chat["stop"]["anyOf"]
    assert (sequence["minLength"], sequence["maxLength"]) == (1, 100)
    assert sequences["items"] == sequence
    assert sequences["maxItems"] == 4
    bias = chat["logit_bias"]["anyOf"][0]
    assert bias["additionalProperties"] is False
    assert bias["patternProperties"]["^[0-9]{1,10}$"] == {"type": "integer", "minimum": -100, "maximum": 100}
    assert chat["max_tokens"]["anyOf"][0] == {"type": "integer", "minimum": 1, "maximum": 2**31 - 1}


def test_the_document_describes_every_answer_with_its_schema(client):
    paths = client.get("/v1/openapi.json").json()["paths"]
    chat = paths["/chat/completions"]["post"]["responses"]
    assert chat["200"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ChatCompletion"}
    assert chat["200"]["content"]["text/event-stream"]["schema"]["properties"]["data"]["type"] == "string"
    assert {"X-Request-Id", "x-ratelimit-remaining-tokens"} <= set(chat["200"]["headers"])
    for status in ("400", "401", "404", "405", "413", "429", "500", "503"):
        assert chat[status]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
    assert "Retry-After" in chat["429"]["headers"]
    assert "Retry-After" in chat["503"]["headers"]
    assert "Allow" in chat["405"]["headers"]
    assert list(paths["/streams/{id}"]["get"]["responses"]["200"]["content"]) == ["text/event-stream"]
    models = paths["/models"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert models == {"$ref": "#/components/schemas/ModelList"}
