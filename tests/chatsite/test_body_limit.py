"""Request bodies over DATA_UPLOAD_MAX_MEMORY_SIZE are refused before they are read."""

from __future__ import annotations

import json

from chatsite.body_limit import BodyLimit

LIMIT = 2_621_440  # settings.DATA_UPLOAD_MAX_MEMORY_SIZE
MB = 2**20


# -- the ASGI middleware, with a stand-in application -------------------------------------


class Recorder:
    """An ASGI application that reads the whole body, as Django does, then answers 200."""

    def __init__(self) -> None:
        self.called = False
        self.received: list[dict] = []

    async def __call__(self, scope, receive, send):
        self.called = True
        while True:
            message = await receive()
            self.received.append(message)
            if message["type"] == "http.disconnect":
                return
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"read"})


async def call(path: str, chunks: list[bytes], headers: list[tuple[bytes, bytes]] | None = None):
    app, sent, receives = Recorder(), [], 0

    async def receive():
        nonlocal receives
        receives += 1
        body = chunks[receives - 1] if receives <= len(chunks) else b""
        return {"type": "http.request", "body": body, "more_body": receives < len(chunks)}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": path, "root_path": "", "headers": headers or []}
    await BodyLimit(app)(scope, receive, send)
    return app, sent, receives


def response_of(sent: list[dict]) -> tuple[int, dict[bytes, bytes], bytes]:
    assert [message["type"] for message in sent] == ["http.response.start", "http.response.body"]
    return sent[0]["status"], dict(sent[0]["headers"]), sent[1]["body"]


async def test_a_content_length_over_the_limit_is_refused_before_any_receive():
    app, sent, receives = await call("/v1/chat/completions", [b"{}"], [(b"content-length", str(LIMIT + 1).encode())])

    status, headers, body = response_of(sent)
    assert status == 413
    assert receives == 0
    assert not app.called
    assert headers[b"content-type"] == b"application/json"
    assert json.loads(body) == {
        "error": {
            "message": f"The request body is larger than the {LIMIT} bytes allowed.",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_too_large",
        }
    }


async def test_pages_get_a_plain_413():
    _, sent, _ = await call("/accounts/login/", [b""], [(b"content-length", str(LIMIT + 1).encode())])

    status, headers, body = response_of(sent)
    assert status == 413
    assert headers[b"content-type"].startswith(b"text/plain")
    assert body.startswith(b"Request body too large")


async def test_a_chunked_body_is_cut_off_once_past_the_limit():
    chunks = [b"x" * MB] * 10  # no Content-Length: 10 MB in 1 MB pieces

    app, sent, receives = await call("/v1/completions", chunks)

    assert receives == 3  # the third MB passed 2.5 MB: nothing more was read
    assert app.received[-1] == {"type": "http.disconnect"}  # the application drops the request
    assert response_of(sent)[0] == 413  # and its own answer, if any, goes nowhere


async def test_bodies_within_the_limit_pass_untouched():
    chunks = [b"x" * MB, b"x" * MB, b"x" * (LIMIT - 2 * MB)]

    app, sent, receives = await call("/v1/completions", chunks, [(b"content-length", str(LIMIT).encode())])

    assert receives == 3
    assert [len(m["body"]) for m in app.received] == [len(c) for c in chunks]
    assert response_of(sent) == (200, {}, b"read")


async def test_no_limit_reads_everything(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = None

    _, sent, receives = await call("/v1/completions", [b"x" * MB] * 4)

    assert receives == 4
    assert response_of(sent)[0] == 200
