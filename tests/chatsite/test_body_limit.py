"""Request bodies over DATA_UPLOAD_MAX_MEMORY_SIZE are refused before they are read."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from chatsite.body_limit import BodyLimit
from tests.livesite import LiveSite

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
    assert status == 413 and receives == 0 and not app.called
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
    assert status == 413 and headers[b"content-type"].startswith(b"text/plain")
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

    assert receives == 3 and [len(m["body"]) for m in app.received] == [len(c) for c in chunks]
    assert response_of(sent) == (200, {}, b"read")


async def test_no_limit_reads_everything(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = None

    _, sent, receives = await call("/v1/completions", [b"x" * MB] * 4)

    assert receives == 4 and response_of(sent)[0] == 200


# -- a real daphne process -----------------------------------------------------------------


@pytest.fixture(scope="module")
def site() -> Iterator[LiveSite]:
    with LiveSite(env={"CHAT_ENABLE_SYNTHETIC": "1", "CHAT_MODEL": "synthetic"}) as site:
        site.baseline_mb = peak_rss_mb(site, reset=True)  # type: ignore[attr-defined]
        yield site


def peak_rss_mb(site: LiveSite, *, reset: bool = False) -> float:
    """The daphne process's peak resident memory since the reset at the start.

    Measured against one baseline for the module: memory taken by one request and freed
    stays with the process, so that a later request could reuse it unseen."""
    assert site.process is not None
    proc = Path(f"/proc/{site.process.pid}")
    if reset:
        (proc / "clear_refs").write_text("5")  # resets VmHWM to the current RSS
    status = dict(line.split(":", 1) for line in (proc / "status").read_text().splitlines())
    return int(status["VmHWM"].split()[0]) / 1024


def stream_of(megabytes: int) -> Iterator[bytes]:
    """A body sent as it is made, never held whole."""
    piece = b"x" * 64 * 1024
    for _ in range(megabytes * 16):
        yield piece


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/v1/chat/completions", {"Content-Length": str(300 * MB)}),
        ("/v1/chat/completions", {}),  # chunked
        ("/accounts/signup/", {"Content-Length": str(300 * MB)}),
        ("/accounts/signup/", {"Expect": "100-continue", "Content-Length": str(300 * MB)}),
    ],
)
def test_an_anonymous_300_mb_post_is_refused_at_once_and_costs_no_memory(site, path, headers):
    started = time.monotonic()

    response = httpx.post(f"{site.base_url}{path}", content=stream_of(300), headers=headers, timeout=60)

    assert response.status_code == 413
    assert time.monotonic() - started < 5
    assert peak_rss_mb(site) - site.baseline_mb < 30  # 300 MB read would show here
    if path.startswith("/v1/"):
        assert response.json()["error"]["code"] == "request_too_large"
    else:
        assert response.text.startswith("Request body too large")


def test_a_chunked_body_is_cut_off_at_the_limit(site):
    sent = 0

    def counted() -> Iterator[bytes]:
        nonlocal sent
        for piece in stream_of(300):
            sent += len(piece)
            yield piece

    response = httpx.post(f"{site.base_url}/v1/completions", content=counted(), timeout=60)

    assert response.status_code == 413
    assert sent < 300 * MB  # the server stopped taking it


def test_requests_within_the_limit_still_work(site):
    body = json.dumps({"model": "synthetic", "messages": [{"role": "user", "content": "x" * (LIMIT - 1000)}]})

    # As far as the API key, whether the body came whole or in pieces.
    for content in (body.encode(), iter([body[:1000].encode(), body[1000:].encode()])):
        response = httpx.post(f"{site.base_url}/v1/chat/completions", content=content, timeout=30)
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{site.base_url}/accounts/signup/").status_code == 200
    assert httpx.get(f"{site.base_url}/healthz").status_code == 200


@pytest.mark.parametrize("content_type", ["multipart/form-data", "multipart/form-data; boundary=x"])
def test_a_body_that_is_no_form_is_the_apis_to_refuse_even_labelled_multipart(site, content_type):
    """Twisted parses a POST's form body before daphne, and answered a bad one with a bare 400."""
    response = httpx.post(
        f"{site.base_url}/v1/chat/completions",
        content=b'{"model": "synthetic", "messages": []}',
        headers={"Content-Type": content_type, "X-Request-Id": "multipart-1"},
    )

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert response.headers["X-Request-Id"] == "multipart-1"
