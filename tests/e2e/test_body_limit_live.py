"""Request bodies over DATA_UPLOAD_MAX_MEMORY_SIZE, sent to a real daphne process: refused
before they are read (the ASGI middleware alone is tested in tests/chatsite/test_body_limit.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.livesite import LiveSite

LIMIT = 2_621_440  # settings.DATA_UPLOAD_MAX_MEMORY_SIZE
MB = 2**20


@pytest.fixture(scope="module")
def site(live_sites) -> LiveSite:
    site = live_sites.site({"CHAT_ENABLE_SYNTHETIC": "1", "CHAT_MODEL": "synthetic"})
    site.baseline_mb = peak_rss_mb(site, reset=True)  # type: ignore[attr-defined]
    return site


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
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
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
