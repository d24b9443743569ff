"""Soak: a minute of new generations and hundreds of SSE readers on one daphne process.

For SECONDS, STARTS_PER_S resumable API streams start on the synthetic model; each is read
to its end by the POST that started it and by more readers that attach over its first
seconds (`GET /v1/streams/<id>`, replaying what they missed), so that about 500
readers are attached at once. Every reader must get every token, in order, and the
server's memory must stay flat while the load goes on. The client is bench/fanout.py's
(raw asyncio HTTP and SSE parsing): on 2 cores it shares the CPU with the server.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from inference.generators import SYNTHETIC_TEXT
from tests.support.livesite import log_errors, run_async, unlimited_api_key
from tests.support.raw_http import Counters, http_request, memory, parse_block, read_events

pytestmark = pytest.mark.slow  # a minute of load by design

SECONDS = int(os.environ.get("SOAK_SECONDS", "60"))  # of new generations; longer by hand
STARTS_PER_S = 2
TOKENS_PER_S = 10
TOKENS = 150  # 15 s per stream
READERS_PER_STREAM = 23  # the POST's own reader and 22 that resume the stream
ATTACH_SPREAD_S = 5.0  # resuming readers join over the stream's first seconds
# Readers attached (request sent, stream not ended) at once in the steady state:
# 2/s x (15 + 22 x 12.5 s) = 580. How many of them already stream (response head in) depends
# on how fast the server answers connects: 300-570 at the peak, seen on 2 loaded cores.
MIN_PEAK_READERS = 500
# Memory is flat when RSS, from SETTLED_S to the end of the load, grows by no more than
# RSS_GROWTH_MB beyond what more readers at once explain: RSS follows the most requests the
# server held at once (about 0.3 MB each; the allocator keeps its high-water mark), and a
# stall of the machine bunches readers up into a higher peak. The stream store also keeps
# each finished stream (150 small events) for 10 minutes. Seen from 20 s to 60 s: 29 to
# 43 MB; a leak of 40 KB per reader would fail. Longer runs (SOAK_SECONDS=180) level off.
RSS_GROWTH_MB = 60.0
RSS_PER_READER_MB = 0.5
SETTLED_S = 20
DEADLINE_S = SECONDS + TOKENS / TOKENS_PER_S + 45  # then whatever still runs is cut off
EXPECTED = " ".join(itertools.islice(itertools.cycle(SYNTHETIC_TEXT.split()), TOKENS))
SITE_ENV = {
    "CHAT_ENABLE_SYNTHETIC": "1",
    "CHAT_MODEL": "synthetic",
    "CHAT_SYNTHETIC_TOKENS_PER_S": str(TOKENS_PER_S),
    # Room for every stream at once: a queued one would get `status` events in its sequence.
    "GENERATION_MAX_CONCURRENT": "256",
    # One user holds every stream and reader open: the per-user limit would refuse most.
    "CHAT_MAX_STREAMS_PER_USER": "10000",
    # The in-memory store even when the suite runs on Redis: through Redis, opening 46
    # streams a second outruns 2 loaded cores (docs/operations.md). SOAK_REDIS_URL tries it.
    "REDIS_URL": os.environ.get("SOAK_REDIS_URL", ""),
}


@dataclass
class Reader:
    """What one reader saw: (id, content, finish_reason) per chunk, and whether [DONE] came."""

    chunks: list[tuple[int, str, str | None]] = field(default_factory=list)
    completion_id: str = ""
    done: bool = False
    error: str | None = None

    def on_blocks(self, now: float, blocks: list[bytes]) -> bool:
        for block in blocks:
            _, seq, data = parse_block(block)
            if not data:
                continue  # a heartbeat or status comment
            if data == [b"[DONE]"]:
                self.done = True
                return True
            chunk = json.loads(b"\n".join(data))
            if "error" in chunk or seq is None:
                self.error = f"unexpected event: {chunk}"
                return True
            self.completion_id = chunk["id"]
            choice = chunk["choices"][0]
            self.chunks.append((seq, choice["delta"].get("content") or "", choice["finish_reason"]))
        return False

    def problem(self) -> str | None:
        """What is wrong with this stream as read: None when it is complete and in order.

        Tokens coalesce, and a chunk's id is the sequence number of its last token: with
        nothing but tokens and the final event in the stream, each chunk must carry exactly
        as many words as its id is past the previous one, or a token was lost or doubled.
        """
        if self.error or not self.done:
            return self.error or "no [DONE]"
        if not self.chunks or self.chunks[0][0] != 0:
            return "no role chunk first"
        previous = 0
        for seq, content, finish_reason in self.chunks[1:-1]:
            if finish_reason is not None or seq <= previous or len(content.split()) != seq - previous:
                return f"chunk {seq} after {previous} carries {content!r}"
            previous = seq
        last_seq, last_content, finish_reason = self.chunks[-1]
        if (previous, last_seq, last_content, finish_reason) != (TOKENS, TOKENS + 1, "", "length"):
            return f"ends with chunk {self.chunks[-1]} after {previous}"
        if self.text != EXPECTED:
            return "text differs"
        return None

    @property
    def text(self) -> str:
        return "".join(content for _, content, _ in self.chunks)


@dataclass
class Soak:
    """The load and what it saw; `run` drives it in one event loop."""

    port: int
    key: str
    pid: int
    streams: list[list[Reader]] = field(default_factory=list)  # each stream's readers
    attached: int = 0  # readers whose request is sent and whose stream has not ended
    streaming: int = 0  # those of them that got the response's head
    samples: list[tuple[float, float, int, int]] = field(default_factory=list)  # s, RSS MB, both
    setups: list[float] = field(default_factory=list)  # seconds from request to response head
    counters: Counters = field(default_factory=Counters)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def run(self) -> None:
        started = time.monotonic()
        sampler = asyncio.create_task(self.sample(started))
        for n in range(SECONDS * STARTS_PER_S):
            await asyncio.sleep(max(0.0, started + n / STARTS_PER_S - time.monotonic()))
            self.tasks.append(asyncio.create_task(self.generation()))
        await asyncio.sleep(max(0.0, started + SECONDS - time.monotonic()))
        self.sample_now(started)
        # Readers join while others run: wait until no task is left, or cut them at the deadline.
        while pending := [task for task in self.tasks if not task.done()]:
            left = started + DEADLINE_S - time.monotonic()
            if left <= 0:
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                break
            await asyncio.wait(pending, timeout=left)
        sampler.cancel()

    async def sample(self, started: float) -> None:
        while True:
            self.sample_now(started)
            await asyncio.sleep(1.0)

    def sample_now(self, started: float) -> None:
        rss = memory(self.pid)["rss_mb"]
        self.samples.append((time.monotonic() - started, rss, self.attached, self.streaming))

    async def generation(self) -> None:
        """Start a stream and read it; its first chunk names it, and the other readers join."""
        body = {
            "model": "synthetic",
            "messages": [{"role": "user", "content": "Go on."}],
            "max_tokens": TOKENS,
            "stream": True,
            "stream_options": {"resumable": True},
        }
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        first = Reader()
        readers = [first]
        self.streams.append(readers)

        def on_blocks(now: float, blocks: list[bytes]) -> bool:
            known = bool(first.completion_id)
            finished = first.on_blocks(now, blocks)
            if first.completion_id and not known:
                for n in range(1, READERS_PER_STREAM):
                    delay = n * ATTACH_SPREAD_S / (READERS_PER_STREAM - 1)
                    self.tasks.append(asyncio.create_task(self.resume(first.completion_id, delay, readers)))
            return finished

        await self.attach(first, "POST", "/v1/chat/completions", headers, on_blocks, json.dumps(body).encode())

    async def resume(self, completion_id: str, delay: float, readers: list[Reader]) -> None:
        await asyncio.sleep(delay)
        reader = Reader()
        readers.append(reader)
        headers = {"Authorization": f"Bearer {self.key}", "Accept": "text/event-stream"}
        await self.attach(reader, "GET", f"/v1/streams/{completion_id}", headers, reader.on_blocks)

    async def attach(
        self,
        reader: Reader,
        method: str,
        path: str,
        headers: dict[str, str],
        on_blocks: Callable[[float, list[bytes]], bool],
        body: bytes = b"",
    ) -> None:
        """Send the request and read its event stream to the end, into `reader`."""
        self.attached += 1
        sent = time.monotonic()
        try:
            response = await http_request(self.port, method, path, self.counters, headers, body)
            self.setups.append(time.monotonic() - sent)
            if response.status != 200:
                reader.error = f"answered {response.status}: {(await response.body())[:200]!r}"
                return
            self.streaming += 1
            try:
                await read_events(response, on_blocks)
            finally:
                self.streaming -= 1
        except Exception as error:
            reader.error = f"{type(error).__name__}: {error}"
        finally:
            self.attached -= 1


def at(samples: list[tuple[float, float, int, int]], second: float) -> tuple[float, int]:
    """The RSS sampled nearest to `second` into the run, and the most readers attached until then."""
    rss = min(samples, key=lambda sample: abs(sample[0] - second))[1]
    return rss, max(attached for s, _, attached, _ in samples if s <= second)


@pytest.mark.timeout(DEADLINE_S + 120)  # the site's start and stop, on top of the load
def test_a_minute_of_streams_and_500_readers_delivers_every_token_in_order_with_flat_memory(live_sites):
    with live_sites.own(SITE_ENV) as site:
        assert site.process is not None
        soak = Soak(site.port, unlimited_api_key(site), site.process.pid)
        began = time.monotonic()
        run_async(soak.run())
        duration = time.monotonic() - began
        peak_rss = memory(site.process.pid)["peak_rss_mb"]
        errors = log_errors(site.log())

    readers = [reader for stream in soak.streams for reader in stream]
    problems = Counter(reader.problem() for reader in readers)
    (settled_rss, settled_peak), (loaded_rss, loaded_peak) = at(soak.samples, SETTLED_S), at(soak.samples, SECONDS)
    allowed_growth = RSS_GROWTH_MB + RSS_PER_READER_MB * (loaded_peak - settled_peak)
    figures = {
        "streams": len(soak.streams),
        "readers": len(readers),
        "events": sum(len(reader.chunks) for reader in readers),
        "peak_attached_readers": max(attached for _, _, attached, _ in soak.samples),
        "peak_streaming_readers": max(streaming for _, _, _, streaming in soak.samples),
        "response_head_p50_s": round(statistics.median(soak.setups or [float("nan")]), 2),
        "response_head_max_s": round(max(soak.setups, default=float("nan")), 2),
        "rss_mb_start": round(soak.samples[0][1], 1),
        f"rss_mb_at_{SETTLED_S}s": round(settled_rss, 1),
        f"rss_mb_at_{SECONDS}s": round(loaded_rss, 1),
        "rss_mb_end": round(soak.samples[-1][1], 1),
        "peak_rss_mb": round(peak_rss, 1),
        f"peak_attached_until_{SETTLED_S}s": settled_peak,
        f"peak_attached_until_{SECONDS}s": loaded_peak,
        "allowed_growth_mb": allowed_growth,
        "duration_s": round(duration, 1),
        "connect_retries": soak.counters.retries,
        "problems": {str(problem): count for problem, count in problems.most_common(5)},
        "server_errors": errors,
        "samples": [(round(s), round(rss), attached, streaming) for s, rss, attached, streaming in soak.samples],
    }
    print("soak:", json.dumps(figures))

    assert len(soak.streams) == SECONDS * STARTS_PER_S
    assert len(readers) == SECONDS * STARTS_PER_S * READERS_PER_STREAM
    assert problems == {None: len(readers)}, figures["problems"]
    assert figures["peak_attached_readers"] >= MIN_PEAK_READERS
    assert loaded_rss - settled_rss <= allowed_growth
    assert errors["tracebacks"] == 0, errors
