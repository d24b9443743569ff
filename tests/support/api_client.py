"""Requests to the OpenAI-compatible API through Django's test client, and reading its answers."""

from __future__ import annotations

import json

from django.test import Client

MODEL = "smollm2-135m-instruct"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}]}
RATE_HEADERS = (
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
)


def post(path: str, body: object, key: str | None, **headers: str):
    if key:
        headers.setdefault("HTTP_AUTHORIZATION", f"Bearer {key}")
    raw = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return Client().post(path, raw, content_type="application/json", **headers)


def get(path: str, key: str | None, **headers: str):
    if key:
        headers.setdefault("HTTP_AUTHORIZATION", f"Bearer {key}")
    return Client().get(path, **headers)


def sse(response) -> list[tuple[str | None, str]]:
    """(id, data) of each event; comments skipped."""
    body = b"".join(response).decode()  # Django consumes the async stream for the sync client
    events = []
    for block in body.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        if "data" in lines:
            events.append((lines.get("id"), lines["data"]))
    return events


def assert_error(response, status: int, code: str | None, param: str | None = None) -> dict:
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert error["code"] == code
    if param:
        assert error["param"] == param
    return error
