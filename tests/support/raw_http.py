"""A raw asyncio HTTP/1.1 client for many streams at once: SSE read block by block as
it arrives, chunked coding decoded by hand. httpx's per-stream cost would be the
bottleneck at hundreds of readers; the soak test and the load benches share this one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
CONNECT_ATTEMPTS = 8
# What a refused connect or a full listen backlog looks like from the client side.
RETRYABLE = (ConnectionRefusedError, ConnectionResetError, ConnectionAbortedError, asyncio.IncompleteReadError)


class ChunkedDecoder:
    """Incremental decoder of HTTP/1.1 chunked transfer coding (daphne streams with it)."""

    def __init__(self) -> None:
        self._buffer = b""
        self._left = 0  # bytes of the current chunk still to come
        self._crlf = False  # the CRLF after a chunk's data is still to come
        self.finished = False

    def feed(self, data: bytes) -> bytes:
        buffer = self._buffer + data if self._buffer else data
        out: list[bytes] = []
        pos = 0
        while not self.finished:
            if self._left:
                piece = buffer[pos : pos + self._left]
                out.append(piece)
                pos += len(piece)
                self._left -= len(piece)
                if self._left:
                    break
                self._crlf = True
            if self._crlf:
                if len(buffer) - pos < 2:
                    break
                pos += 2
                self._crlf = False
            end = buffer.find(b"\r\n", pos)
            if end < 0:
                break
            size = int(buffer[pos:end].split(b";", 1)[0], 16)
            pos = end + 2
            if size == 0:
                self.finished = True
            self._left = size
        self._buffer = buffer[pos:]
        return b"".join(out)


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    @property
    def chunked(self) -> bool:
        return "chunked" in self.headers.get("transfer-encoding", "").lower()

    async def body(self) -> bytes:
        """The whole body of a non-streaming response (the server closes the connection)."""
        data = await self.reader.read()
        self.close()
        return ChunkedDecoder().feed(data) if self.chunked else data

    def close(self) -> None:
        self.writer.close()


@dataclass
class Counters:
    """Client-side trouble of one phase."""

    retries: int = 0
    timed_out: int = 0  # streams still open when the phase's timeout struck
    retry_errors: dict[str, int] = field(default_factory=dict)


async def http_request(
    port: int, method: str, path: str, counters: Counters, headers: dict[str, str] | None = None, body: bytes = b""
) -> Response:
    """Send one request on a new connection and read the response head.

    A refused or reset connection before any response byte is retried with backoff:
    1000 clients at once can still overflow daphne's listen backlog, deep as it is (tests.support.livesite).
    """
    lines = [f"{method} {path} HTTP/1.1", f"Host: {HOST}:{port}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    request = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
    delay = 0.05
    for attempt in range(CONNECT_ATTEMPTS):
        writer: asyncio.StreamWriter | None = None
        try:
            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            break
        except RETRYABLE as error:
            if writer is not None:
                writer.close()
            if attempt == CONNECT_ATTEMPTS - 1:
                raise
            counters.retries += 1
            name = type(error).__name__
            counters.retry_errors[name] = counters.retry_errors.get(name, 0) + 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
    assert writer is not None  # the loop either broke out connected or raised
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parsed = {}
    for line in header_lines:
        if line:
            name, _, value = line.partition(":")
            parsed[name.strip().lower()] = value.strip()
    return Response(int(status_line.split(" ", 2)[1]), parsed, reader, writer)


def parse_block(block: bytes) -> tuple[bytes, int | None, list[bytes]]:
    """One SSE event block → (event type, id, data lines); no data lines for comments."""
    kind = b"message"
    seq: int | None = None
    data: list[bytes] = []
    for line in block.split(b"\n"):
        if line.startswith(b"data:"):
            data.append(line[6:] if line.startswith(b"data: ") else line[5:])
        elif line.startswith(b"id:"):
            seq = int(line[3:])
        elif line.startswith(b"event:"):
            kind = line[6:].strip()
    return kind, seq, data


async def read_events(response: Response, on_blocks: Callable[[float, list[bytes]], bool]) -> None:
    """Feed complete SSE event blocks to `on_blocks` until it returns True or the body ends.

    Events that arrive in one read share one timestamp: they reached us together.
    """
    decoder = ChunkedDecoder() if response.chunked else None
    pending = b""
    try:
        while True:
            data = await response.reader.read(65536)
            if not data:
                return
            now = time.perf_counter()
            if decoder is not None:
                data = decoder.feed(data)
            pending += data
            if b"\n\n" in pending:
                *blocks, pending = pending.split(b"\n\n")
                if on_blocks(now, blocks):
                    return
            if decoder is not None and decoder.finished:
                return
    finally:
        response.close()


def memory(pid: int) -> dict[str, float]:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {
        "peak_rss_mb": int(status["VmHWM"].split()[0]) / 1024,
        "rss_mb": int(status["VmRSS"].split()[0]) / 1024,
        "threads": int(status["Threads"]),
    }
