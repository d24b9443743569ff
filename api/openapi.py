"""The OpenAPI 3.1 document of the developer API, built from the request schemas."""

from __future__ import annotations

from functools import cache
from typing import Any

from api.schemas import ChatCompletionRequest, CompletionRequest
from inference.streams import MAX_SEQUENCE

ERROR = {"$ref": "#/components/schemas/Error"}
SEQUENCE = {"type": "integer", "minimum": 0, "maximum": MAX_SEQUENCE}


def _responses(ok: str, *extra: int) -> dict[str, Any]:
    responses: dict[str, Any] = {"200": {"description": ok}}
    for status in (400, 401, *extra):
        responses[str(status)] = {"description": _STATUS[status], "content": {"application/json": {"schema": ERROR}}}
    responses["default"] = {"description": _OTHER_ERRORS, "content": {"application/json": {"schema": ERROR}}}
    return responses


_OTHER_ERRORS = (
    "Any other error, in the same shape: 404 for an unknown path, 405 (with Allow) for another method, "
    "500 whose message names the X-Request-Id under which the server's log has the details"
)


_STATUS = {
    400: "invalid_request_error, context_length_exceeded",
    401: "invalid_api_key",
    404: "model_not_found or stream_not_found",
    413: "request body too large",
    429: "rate_limit_exceeded, insufficient_quota or too_many_concurrent_streams (with Retry-After)",
    503: "server_overloaded (with Retry-After)",
}

_STREAM_ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "The completion's id, e.g. chatcmpl-…",
}


@cache
def openapi_document() -> dict[str, Any]:
    def body(schema: str) -> dict[str, Any]:
        return {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
        }

    streamed = (
        "A JSON object, or with stream=true a text/event-stream of chunks ending with data: [DONE]; "
        "while the request waits for room, comment lines say so (': queued, N ahead', then ': running')"
    )
    schemas: dict[str, Any] = {
        "Error": {
            "type": "object",
            "properties": {
                "error": {
                    "type": "object",
                    "properties": {
                        "message": {"type": "string"},
                        "type": {"type": "string"},
                        "param": {"type": ["string", "null"]},
                        "code": {"type": ["string", "null"]},
                    },
                }
            },
        },
    }
    for model in (ChatCompletionRequest, CompletionRequest):
        generated = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(generated.pop("$defs", {}))
        schemas[model.__name__] = generated
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "chatsite API",
            "version": "1",
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
            "/models": {"get": {"summary": "List the models", "responses": _responses("An OpenAI list of models")}},
            "/chat/completions": {
                "post": {
                    "summary": "Create a chat completion",
                    "requestBody": body("ChatCompletionRequest"),
                    "responses": _responses(streamed, 404, 413, 429, 503),
                }
            },
            "/completions": {
                "post": {
                    "summary": "Create a text completion (legacy)",
                    "requestBody": body("CompletionRequest"),
                    "responses": _responses(streamed, 404, 413, 429, 503),
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
                    "responses": _responses("A text/event-stream of the chunks after that event", 404),
                }
            },
            "/streams/{id}/cancel": {
                "post": {
                    "summary": "Stop a generation you own",
                    "parameters": [_STREAM_ID],
                    "responses": _responses("{id, object: stream.cancellation, cancelled}", 404),
                }
            },
            "/usage": {
                "get": {
                    "summary": "Your plan, what you used and what is left",
                    "responses": _responses("Plan, requests and tokens: limits, used, remaining, resets"),
                }
            },
        },
    }
