"""A burst of connections at a real daphne: every one is accepted and served to its end.

Twisted listens with a backlog of 50 unless told otherwise; a burst of 256 clients then
overflowed the kernel's accept queue and clients saw their connections dropped
(`httpx.ReadError`). daphne is started with a deep backlog everywhere (tests.support.livesite).
"""

from __future__ import annotations

import asyncio
import itertools
import json

import httpx
import pytest

from inference.generators import SYNTHETIC_TEXT
from tests.support.livesite import run_async, unlimited_api_key

pytestmark = pytest.mark.slow  # a burst of 256 streams

BURST = 256
TOKENS = 8
EXPECTED = " ".join(itertools.islice(itertools.cycle(SYNTHETIC_TEXT.split()), TOKENS))
SITE_ENV = {
    "CHAT_ENABLE_SYNTHETIC": "1",
    "CHAT_MODEL": "synthetic",
    "CHAT_SYNTHETIC_TOKENS_PER_S": "200",
    # Room for the whole burst at once, generating and waiting: the test is about the door.
    "GENERATION_MAX_CONCURRENT": str(BURST),
    "GENERATION_MAX_QUEUE": str(BURST),
    # One user opens the whole burst: past the per-user stream limit it would be refused.
    "CHAT_MAX_STREAMS_PER_USER": str(BURST),
}


@pytest.fixture(scope="module")
def burst_site(live_sites):
    return live_sites.site(SITE_ENV)


async def _stream_once(client: httpx.AsyncClient, start: asyncio.Event, key: str) -> tuple[int, str, bool]:
    """One streamed completion, sent when `start` fires: (status, its text, whether [DONE] came)."""
    await start.wait()
    body = {
        "model": "synthetic",
        "messages": [{"role": "user", "content": "hello"}],
        "stream": True,
        "max_tokens": TOKENS,
    }
    text, done = [], False
    async with client.stream(
        "POST", "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as response:
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                text.extend(choice["delta"].get("content", "") for choice in json.loads(line[6:])["choices"])
    return response.status_code, "".join(text), done


async def _burst(base_url: str, key: str) -> list[tuple[int, str, bool] | BaseException]:
    # A connection of its own for each request, and no pool limit: all connect at once.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=120) as client:
        start = asyncio.Event()
        tasks = [asyncio.create_task(_stream_once(client, start, key)) for _ in range(BURST)]
        await asyncio.sleep(0.2)  # every task waits at the start line
        start.set()
        return await asyncio.gather(*tasks, return_exceptions=True)


def test_a_burst_of_256_streams_is_served_whole_with_no_connection_dropped(burst_site):
    key = unlimited_api_key(burst_site)
    results = run_async(_burst(burst_site.base_url, key))
    failures = [repr(result) for result in results if isinstance(result, BaseException)]
    assert failures == [], f"{len(failures)} of {BURST} failed, e.g. {failures[:3]}"
    assert [status for status, _, _ in results] == [200] * BURST  # type: ignore[misc]
    assert all(done for _, _, done in results)  # type: ignore[misc]
    assert {text.strip() for _, text, _ in results} == {EXPECTED}  # type: ignore[misc]
