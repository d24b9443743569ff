"""The OpenAPI 3.1 document of the developer API, built from the request schemas."""

from __future__ import annotations

from functools import cache
from typing import Any

from api.changelog import API_VERSION
from api.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    ResponseCreateRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from inference.streams import MAX_SEQUENCE

ERROR = {"$ref": "#/components/schemas/Error"}
SEQUENCE = {"type": "integer", "minimum": 0, "maximum": MAX_SEQUENCE}
# OpenAPI 3.1 describes an event stream's events, each one read as {id, event, data}.
STREAM = {
    "type": "object",
    "description": "A server-sent event: `id:` its sequence number, `data:` a chunk's JSON, and last [DONE]; "
    'an error after the stream began is a {"error": …} object before [DONE]. Comment lines (`: ping`) are no events.',
    "properties": {
        "id": {"type": "string", "pattern": "^[0-9]+$"},
        "event": {"const": "message"},
        "data": {"type": "string", "pattern": r"^(\{.*\}|\[DONE\])$"},
    },
    "required": ["data"],
}
# A Responses stream's events (POST /v1/responses with stream, GET /v1/responses/{id}?stream=true).
RESPONSE_STREAM = {
    "type": "object",
    "description": "A server-sent event of OpenAI's Responses stream: `id:` and the data's sequence_number, "
    "`event:` and the data's type (response.created, response.in_progress, response.output_item.added, "
    "response.content_part.added, response.output_text.delta…, response.output_text.done, "
    "response.content_part.done, response.output_item.done, then response.completed, response.incomplete or "
    "response.failed). Comment lines (`: ping`, `: queued, N ahead`) are no events.",
    "properties": {
        "id": {"type": "string", "pattern": "^[0-9]+$"},
        "event": {"type": "string", "pattern": "^response\\."},
        "data": {"type": "string", "pattern": r"^\{.*\}$"},
    },
    "required": ["id", "event", "data"],
}
RATE_LIMIT_HEADERS = (
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
)


def _header(description: str, *, required: bool = True, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"description": description, "required": required, "schema": schema or {"type": "string"}}


REQUEST_ID = _header("The request's id, the one the server's log lines carry (the client's own if it sent one)")
RETRY_AFTER = _header("Seconds to wait before trying again", schema={"type": "string", "pattern": "^[0-9]+$"})

_STATUS = {
    400: "invalid_request_error: bad JSON, a wrong type, an out-of-range value, an unknown field; "
    "context_length_exceeded",
    401: "invalid_api_key",
    404: "model_not_found, stream_not_found, response_not_found, or an unknown path",
    405: "Another method than the path's (with Allow)",
    413: "request_too_large: the body is over the size allowed",
    429: "rate_limit_exceeded, insufficient_quota, too_many_concurrent_streams or too_many_connections "
    "(with Retry-After)",
    500: "A failure; its message names the X-Request-Id under which the server's log has the details",
    503: "server_overloaded (with Retry-After)",
}


CACHE = _header(
    "hit: the answer came from the response cache; miss: a cacheable request (temperature 0 or a seed), "
    "generated. Absent where the cache does not apply",
    required=False,
    schema={"enum": ["hit", "miss"]},
)
COST = _header(
    "What the answer cost at its model's price when it was admitted, a plain decimal string "
    "(e.g. 0.0000123000), in the currency of x-chatsite-cost-currency. Absent where the model has no price",
    required=False,
    schema={"type": "string", "pattern": "^[0-9]+\\.[0-9]+$"},
)
COST_CURRENCY = _header("The currency of x-chatsite-cost (e.g. USD)", required=False)


def _ok(
    description: str, schema: str, *, stream: bool = False, cached: bool = False, events: dict[str, Any] = STREAM
) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}
    if stream:
        content["text/event-stream"] = {"schema": events}
    headers = {
        "X-Request-Id": REQUEST_ID,
        **{name: _header("OpenAI's rate-limit header") for name in RATE_LIMIT_HEADERS},
        **(
            {"x-chatsite-cache": CACHE, "x-chatsite-cost": COST, "x-chatsite-cost-currency": COST_CURRENCY}
            if cached
            else {}
        ),
    }
    return {"description": description, "headers": headers, "content": content}


def _responses(
    ok: dict[str, Any], *, sent: bool = False, model: bool = False, streamed: bool = False, loads: bool = False
) -> dict[str, Any]:
    """`ok` and the errors an operation may answer: those of a body if `sent`, of a generation
    if `model`, of an event stream (too_many_connections) if `streamed`, of a model that may
    be loading (503) if `loads`."""
    statuses = [400, 401, 404, 405, 500]
    if sent:
        statuses.append(413)
    if model:
        statuses += [429, 503]
    elif streamed:
        statuses.append(429)
    if loads and not model:
        statuses.append(503)
    responses: dict[str, Any] = {"200": ok}
    for status in sorted(statuses):
        headers = {"X-Request-Id": REQUEST_ID}
        if status in (429, 503):
            headers["Retry-After"] = RETRY_AFTER
        if status == 405:
            headers["Allow"] = _header("The methods the path takes")
        responses[str(status)] = {
            "description": _STATUS[status],
            "headers": headers,
            "content": {"application/json": {"schema": ERROR}},
        }
    responses["default"] = {
        "description": "Any other error, in the same shape (a model server's 502 or 504, say)",
        "headers": {"X-Request-Id": REQUEST_ID},
        "content": {"application/json": {"schema": ERROR}},
    }
    return responses


def _object(properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), **extra}


INTEGER = {"type": "integer"}
STRING = {"type": "string"}
NULLABLE_NUMBER = {"type": ["number", "null"]}
AMOUNT = {"type": ["integer", "string"], "description": "Tokens (an integer) or money (a decimal string)"}
DATE_TIME = {"type": "string", "format": "date-time"}
FINISH_REASON = {"enum": ["stop", "length", "tool_calls", "content_filter"]}
RESPONSE_SCHEMAS: dict[str, Any] = {
    "Error": _object(
        {
            "error": _object(
                {
                    "message": STRING,
                    "type": STRING,
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "null"]},
                }
            )
        }
    ),
    "CompletionUsage": {
        "type": "object",
        "properties": {
            "prompt_tokens": INTEGER,
            "completion_tokens": INTEGER,
            "total_tokens": INTEGER,
            "prompt_tokens_details": {
                **_object({"cached_tokens": INTEGER}),
                "description": "The prompt's tokens the model did not run again (it reused their keys and values)",
            },
            # Ours, in a stream's usage chunk where the model has a price.
            "cost": {"type": "string", "description": "The request's cost (a stream's usage chunk, if priced)"},
            "currency": {"type": "string", "description": "The currency of cost"},
        },
        "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
    },
    "ChatCompletion": _object(
        {
            "id": {"type": "string", "pattern": "^chatcmpl-"},
            "object": {"const": "chat.completion"},
            "created": INTEGER,
            "model": STRING,
            "choices": {
                "type": "array",
                "items": _object(
                    {
                        "index": INTEGER,
                        "message": {
                            "type": "object",
                            "properties": {
                                "role": {"const": "assistant"},
                                "content": {"type": ["string", "null"]},
                                "refusal": {"type": "null"},
                                "tool_calls": {"type": "array", "items": {"type": "object"}},
                            },
                            "required": ["role", "content"],
                        },
                        "finish_reason": FINISH_REASON,
                        "logprobs": {"type": ["object", "null"]},
                    }
                ),
            },
            "usage": {"$ref": "#/components/schemas/CompletionUsage"},
        }
    ),
    "TextCompletion": _object(
        {
            "id": {"type": "string", "pattern": "^cmpl-"},
            "object": {"const": "text_completion"},
            "created": INTEGER,
            "model": STRING,
            "choices": {
                "type": "array",
                "items": _object(
                    {"index": INTEGER, "text": STRING, "finish_reason": FINISH_REASON, "logprobs": {"type": "null"}}
                ),
            },
            "usage": {"$ref": "#/components/schemas/CompletionUsage"},
        }
    ),
    "ModelList": _object(
        {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": _object(
                    {
                        "id": STRING,
                        "object": {"const": "model"},
                        "created": INTEGER,
                        "owned_by": STRING,
                        # Ours: which endpoint takes it.
                        "kind": {
                            "enum": ["chat", "embedding"],
                            "description": "chat: completions and responses; embedding: /embeddings",
                        },
                    }
                ),
            },
        }
    ),
    "EmbeddingList": _object(
        {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": _object(
                    {
                        "object": {"const": "embedding"},
                        "index": INTEGER,
                        "embedding": {
                            "anyOf": [{"type": "array", "items": {"type": "number"}}, STRING],
                            "description": "Numbers, or with encoding_format base64 the float32 little-endian bytes",
                        },
                    }
                ),
            },
            "model": STRING,
            "usage": _object({"prompt_tokens": INTEGER, "total_tokens": INTEGER}),
        }
    ),
    "TokenizeResponse": {
        "type": "object",
        "properties": {
            "count": INTEGER,
            "max_model_len": INTEGER,
            "tokens": {"type": "array", "items": INTEGER},
            "token_strs": {"type": "array", "items": STRING, "description": "With return_token_strs"},
        },
        "required": ["count", "max_model_len", "tokens"],
    },
    "DetokenizeResponse": _object({"prompt": STRING}),
    "Response": _object(
        {
            "id": {"type": "string", "pattern": "^resp_"},
            "object": {"const": "response"},
            "created_at": INTEGER,
            "status": {"enum": ["completed", "incomplete", "cancelled", "failed", "in_progress"]},
            "background": {"type": "boolean"},
            "completed_at": {"type": ["integer", "null"]},
            "error": {"anyOf": [_object({"code": STRING, "message": STRING}), {"type": "null"}]},
            "incomplete_details": {"anyOf": [_object({"reason": STRING}), {"type": "null"}]},
            "instructions": {"type": ["string", "null"]},
            "max_output_tokens": {"type": ["integer", "null"]},
            "metadata": {"type": "object", "additionalProperties": STRING},
            "model": STRING,
            "output": {
                "type": "array",
                "items": _object(
                    {
                        "id": {"type": "string", "pattern": "^msg_"},
                        "type": {"const": "message"},
                        "role": {"const": "assistant"},
                        "status": {"enum": ["in_progress", "completed", "incomplete"]},
                        "content": {
                            "type": "array",
                            "items": _object(
                                {
                                    "type": {"const": "output_text"},
                                    "text": STRING,
                                    "annotations": {"type": "array", "maxItems": 0},
                                    "logprobs": {"type": "array", "maxItems": 0},
                                }
                            ),
                        },
                    }
                ),
            },
            "parallel_tool_calls": {"const": False},
            "previous_response_id": {"type": ["string", "null"]},
            "service_tier": STRING,
            "store": {"type": "boolean"},
            "temperature": NULLABLE_NUMBER,
            "text": {"type": "object"},
            "tool_choice": STRING,
            "tools": {"type": "array", "maxItems": 0},
            "top_p": NULLABLE_NUMBER,
            "truncation": {"const": "disabled"},
            "usage": {
                "anyOf": [
                    _object(
                        {
                            "input_tokens": INTEGER,
                            "input_tokens_details": _object({"cached_tokens": INTEGER}),
                            "output_tokens": INTEGER,
                            "output_tokens_details": _object({"reasoning_tokens": INTEGER}),
                            "total_tokens": INTEGER,
                        }
                    ),
                    {"type": "null"},
                ]
            },
            "user": {"type": "null"},
        }
    ),
    "ResponseDeleted": _object({"id": STRING, "object": {"const": "response.deleted"}, "deleted": {"const": True}}),
    "StreamCancellation": _object(
        {"id": STRING, "object": {"const": "stream.cancellation"}, "cancelled": {"type": "boolean"}}
    ),
    "Usage": _object(
        {
            "object": {"const": "usage"},
            "plan": STRING,
            "requests": _object({"per_minute": INTEGER, "used": INTEGER, "remaining": INTEGER, "resets_in_s": INTEGER}),
            "tokens": _object({"per_day": INTEGER, "used": INTEGER, "remaining": INTEGER, "resets_in_s": INTEGER}),
            "max_concurrent_streams": INTEGER,
            "max_tokens_per_request": INTEGER,
            "spend_today": {
                "type": "object",
                "additionalProperties": STRING,
                "description": "Today's (UTC) cost of settled requests by currency, as decimal strings; {} if unpriced",
            },
            "tool_calls_today": {
                "type": "integer",
                "description": "Tools the user's answers called today (UTC), on every channel",
            },
            "team": {"type": ["string", "null"], "description": "The team the key's requests count against"},
            "budgets": {
                "type": "array",
                "description": "Each budget that applies (plan, account, key, team), least left first",
                "items": {"$ref": "#/components/schemas/Budget"},
            },
        }
    ),
    "Budget": _object(
        {
            "scope": {"enum": ["plan", "account", "key", "team"]},
            "period": {"enum": ["day", "week", "month", "rolling_30d"]},
            "unit": {"enum": ["tokens", "money"]},
            "currency": {"type": ["string", "null"], "description": "A budget in money's currency; null for tokens"},
            # Tokens as integers; money as decimal strings, like every cost.
            "limit": AMOUNT,
            "used": AMOUNT,
            "remaining": AMOUNT,
            "soft_limit_percent": {"type": ["integer", "null"]},
            "period_start": DATE_TIME,
            "resets_at": {
                **DATE_TIME,
                "description": "When the period ends; in a rolling window, when its oldest use leaves it",
            },
        }
    ),
}

# Where vLLM has them: the site's root, not /v1.
ROOT = [{"url": "/"}]

_STREAM_ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "The completion's id, e.g. chatcmpl-…",
}


_RESPONSE_ID = {
    "name": "response_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "The response's id, resp_…",
}


def _stream_resumed() -> dict[str, Any]:
    ok = _ok("A text/event-stream of the chunks after that event", "ChatCompletion", stream=True)
    del ok["content"]["application/json"]
    return ok


@cache
def openapi_document() -> dict[str, Any]:
    def body(schema: str) -> dict[str, Any]:
        return {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
        }

    streamed = (
        "A JSON object, or with stream=true a text/event-stream of chunks ending with data: [DONE]; "
        "while the request waits for room, comment lines say so (': queued, N ahead', then ': running'); "
        'an error after the stream began is a data: {"error": …} event before [DONE]'
    )
    schemas: dict[str, Any] = dict(RESPONSE_SCHEMAS)
    for model in (
        ChatCompletionRequest,
        CompletionRequest,
        TokenizeCompletionRequest,
        TokenizeChatRequest,
        DetokenizeRequest,
        ResponseCreateRequest,
        EmbeddingRequest,
    ):
        generated = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(generated.pop("$defs", {}))
        schemas[model.__name__] = generated
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "chatsite API",
            "version": API_VERSION,
            "description": "OpenAI-compatible streaming chat API. Authenticate with 'Authorization: Bearer <key>' "
            "(or 'X-API-Key: <key>'); keys are made at /accounts/keys/. Every response carries "
            "x-ratelimit-* headers. The request fields OpenAI documents are accepted at their neutral "
            "values (n 1, frequency_penalty 0, logprobs false, response_format text, store false, …); "
            "a value the model asked for cannot honour is a 400 whose param names the field, and so is a field "
            "not listed here.",
        },
        "servers": [{"url": "/v1"}],
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
            },
        },
        "security": [{"bearer": []}, {"apiKey": []}],
        "paths": {
            "/models": {
                "get": {
                    "summary": "List the models",
                    "responses": _responses(_ok("An OpenAI list of models", "ModelList")),
                }
            },
            "/chat/completions": {
                "post": {
                    "summary": "Create a chat completion",
                    "requestBody": body("ChatCompletionRequest"),
                    "responses": _responses(
                        _ok(streamed, "ChatCompletion", stream=True, cached=True), sent=True, model=True
                    ),
                }
            },
            "/completions": {
                "post": {
                    "summary": "Create a text completion (legacy)",
                    "requestBody": body("CompletionRequest"),
                    "responses": _responses(
                        _ok(streamed, "TextCompletion", stream=True, cached=True), sent=True, model=True
                    ),
                }
            },
            "/embeddings": {
                "post": {
                    "summary": "Create embeddings: a unit vector per input text (an embedding model of /models)",
                    "requestBody": body("EmbeddingRequest"),
                    "responses": _responses(
                        _ok("An OpenAI list of embeddings, with usage", "EmbeddingList"), sent=True, model=True
                    ),
                }
            },
            "/streams/{id}": {
                "get": {
                    "summary": "Resume a streamed completion after Last-Event-ID (or ?after=), then follow it live",
                    "parameters": [
                        _STREAM_ID,
                        {"name": "after", "in": "query", "schema": SEQUENCE},
                        {"name": "Last-Event-ID", "in": "header", "schema": SEQUENCE},
                    ],
                    "responses": _responses(_stream_resumed(), streamed=True),
                }
            },
            "/streams/{id}/cancel": {
                "post": {
                    "summary": "Stop a generation you own",
                    "parameters": [_STREAM_ID],
                    "responses": _responses(_ok("Whether a running generation was stopped", "StreamCancellation")),
                }
            },
            "/responses": {
                "post": {
                    "summary": "Create a response (OpenAI's Responses API)",
                    "requestBody": body("ResponseCreateRequest"),
                    "responses": _responses(
                        _ok(
                            "The response; with background, at once and in progress; with stream=true a "
                            "text/event-stream of the Responses events, numbered by sequence_number",
                            "Response",
                            stream=True,
                            events=RESPONSE_STREAM,
                        ),
                        sent=True,
                        model=True,
                    ),
                }
            },
            "/responses/{response_id}": {
                "get": {
                    "summary": "A stored response of yours; with stream=true its events after starting_after, "
                    "then live",
                    "parameters": [
                        _RESPONSE_ID,
                        {"name": "stream", "in": "query", "schema": {"type": "boolean"}},
                        {
                            "name": "starting_after",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": -1, "maximum": MAX_SEQUENCE},
                            "description": "The sequence_number after which to resume the stream",
                        },
                    ],
                    "responses": _responses(
                        _ok(
                            "The response, or a text/event-stream of its events",
                            "Response",
                            stream=True,
                            events=RESPONSE_STREAM,
                        ),
                        streamed=True,
                    ),
                },
                "delete": {
                    "summary": "Delete a stored response of yours",
                    "parameters": [_RESPONSE_ID],
                    "responses": _responses(_ok("The response is deleted", "ResponseDeleted")),
                },
            },
            "/responses/{response_id}/cancel": {
                "post": {
                    "summary": "Stop a stored response of yours that is in progress",
                    "parameters": [_RESPONSE_ID],
                    "responses": _responses(_ok("The response as it ended", "Response")),
                }
            },
            "/usage": {
                "get": {
                    "summary": "Your plan, what you used and what is left",
                    "responses": _responses(_ok("Plan, requests and tokens: limits, used, remaining, resets", "Usage")),
                }
            },
            # vLLM's, at the site's root as there; not counted against a plan.
            "/tokenize": {
                "post": {
                    "summary": "A prompt's tokens, or a chat's as the model's template renders it (vLLM's)",
                    "servers": ROOT,
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "oneOf": [
                                        {"$ref": "#/components/schemas/TokenizeCompletionRequest"},
                                        {"$ref": "#/components/schemas/TokenizeChatRequest"},
                                    ]
                                }
                            }
                        },
                    },
                    "responses": _responses(
                        _ok("The tokens, their count and the model's context length", "TokenizeResponse"),
                        sent=True,
                        loads=True,
                    ),
                }
            },
            "/detokenize": {
                "post": {
                    "summary": "The text of token ids (vLLM's)",
                    "servers": ROOT,
                    "requestBody": body("DetokenizeRequest"),
                    "responses": _responses(_ok("The text", "DetokenizeResponse"), sent=True, loads=True),
                }
            },
        },
    }
