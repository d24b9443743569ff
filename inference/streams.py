"""Stream stores: the ordered, replayable events of each generation.

The producer (the engine thread) appends events; any number of readers, in any
event loop, read them back from any point. Readers never talk to the producer.
No Django imports here.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

TERMINAL_EVENTS = frozenset({"done", "error"})
# Sequence numbers are Redis stream ids' sequence part: at most a signed 64-bit integer here.
MAX_SEQUENCE = 2**63 - 1

# Every producer (an engine, a model-server pool, a Celery worker) beats this often, and a
# beat lives three periods: one late beat on a busy machine does not get a live producer's
# runs reaped, and a dead one's are found within 6 s, settled by housekeeping within the
# 15 s promised (docs/scaling.md).
PRODUCER_BEAT_S = 2.0
PRODUCER_BEAT_TTL_S = 3 * PRODUCER_BEAT_S


class GenerationStatus(StrEnum):
    """Where a generation stands: a result's status, and its saved records' (the usage
    record's and the chat answer's, accounts.models)."""

    STREAMING = "streaming"
    COMPLETE = "complete"
    STOPPED = "stopped"  # by its reader (Stop); one ended by a stop sequence is COMPLETE
    ERROR = "error"
    INTERRUPTED = "interrupted"  # its producer stopped or died; the text so far is kept


def interrupted_event(**data: Any) -> tuple[str, dict[str, Any]]:
    """The terminal event of an answer whose producer could not finish it (its process
    stopped, or it died and was reaped): an `error` that readers know by its message,
    "interrupted", after which the saved answer holds the text written so far. Every
    producer and the reaper end such a stream with this one event."""
    return "error", {"message": "interrupted", **data, "status": GenerationStatus.INTERRUPTED}


@dataclass(frozen=True)
class StreamEvent:
    seq: int
    type: str
    data: dict[str, Any]

    @property
    def terminal(self) -> bool:
        return self.type in TERMINAL_EVENTS


class StreamNotFound(LookupError):
    pass


class StreamStore(Protocol):
    # In this process's memory: its calls never wait on the network, so an event loop may
    # make them, and no other process appends to its streams or cancels them.
    local: bool

    def create(self, stream_id: str) -> None: ...
    def append(self, stream_id: str, type: str, data: dict[str, Any]) -> int: ...
    def append_many(self, events: list[tuple[str, str, dict[str, Any]]]) -> list[int | Exception]: ...
    def exists(self, stream_id: str) -> bool: ...
    def cancel(self, stream_id: str) -> bool: ...
    def is_cancelled(self, stream_id: str) -> bool: ...
    def cancelled_among(self, stream_ids: list[str]) -> set[str]: ...
    def events(self, stream_id: str, after: int = 0) -> list[StreamEvent]: ...
    def read(
        self, stream_id: str, after: int = 0, *, heartbeat_s: float | None = None
    ) -> AsyncIterator[list[StreamEvent]]: ...
    def claim(self, stream_id: str, producer: str) -> bool: ...
    def claimants(self, stream_ids: list[str]) -> dict[str, str]: ...
    def beat(self, producer: str, ttl_s: float) -> None: ...
    def producer_alive(self, producer: str) -> bool: ...
    def expire_finished(self) -> int: ...


@dataclass
class _Stream:
    events: list[StreamEvent] = field(default_factory=list)
    cancelled: bool = False
    finished_at: float | None = None
    producer: str | None = None  # the worker that claimed it
    waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = field(default_factory=list)


class InMemoryStreamStore:
    """Streams of one process, kept `retention_s` seconds after their terminal event."""

    local = True

    def __init__(self, retention_s: float = 600.0) -> None:
        self.retention_s = retention_s
        self._lock = threading.Lock()
        self._streams: dict[str, _Stream] = {}
        # (finished_at, stream id) in the order they finished, oldest first: expiring takes
        # from the front what is past retention, where scanning every stream on each
        # create cost more the longer the process ran (100,000 streams kept at 170/s).
        self._finished: deque[tuple[float, str]] = deque()
        self._beats: dict[str, float] = {}
        # Readers to wake, per event loop: one cross-thread wake-up per loop and batch,
        # not one per reader and token (20,000 a second with 1,000 readers).
        self._to_wake: dict[asyncio.AbstractEventLoop, list[asyncio.Event]] = {}

    def create(self, stream_id: str) -> None:
        with self._lock:
            self._drop_expired()
            self._streams.setdefault(stream_id, _Stream())

    def append(self, stream_id: str, type: str, data: dict[str, Any]) -> int:
        loops: list[asyncio.AbstractEventLoop] = []
        with self._lock:
            seq = self._append_locked(stream_id, type, data, loops)
        self._wake_soon(loops)
        return seq

    def append_many(self, events: list[tuple[str, str, dict[str, Any]]]) -> list[int | Exception]:
        """`append` for each (stream id, type, data), in order: each one's sequence number,
        or the error that one raised (StreamNotFound, ValueError); the others still go in.
        Each reader's loop is woken once for the lot, not once per event."""
        results: list[int | Exception] = []
        loops: list[asyncio.AbstractEventLoop] = []
        with self._lock:
            for event in events:
                try:
                    results.append(self._append_locked(*event, loops))
                except (StreamNotFound, ValueError) as error:
                    results.append(error)
        self._wake_soon(loops)
        return results

    def _append_locked(
        self, stream_id: str, type: str, data: dict[str, Any], loops: list[asyncio.AbstractEventLoop]
    ) -> int:
        """Append under the lock; the loops whose readers now need waking go into `loops`."""
        stream = self._get(stream_id)
        if stream.finished_at is not None:
            raise ValueError(f"stream {stream_id} already ended")
        event = StreamEvent(seq=len(stream.events) + 1, type=type, data=data)
        stream.events.append(event)
        if event.terminal:
            stream.finished_at = time.monotonic()
            self._finished.append((stream.finished_at, stream_id))
        for loop, waiter in stream.waiters:
            pending = self._to_wake.setdefault(loop, [])
            if not pending:
                loops.append(loop)
            pending.append(waiter)
        stream.waiters = []
        return event.seq

    def _wake_soon(self, loops: list[asyncio.AbstractEventLoop]) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for loop in loops:
            if loop is running:  # a producer on its readers' loop (the upstream pool's on the web server's)
                loop.call_soon(self.wake_readers, loop)
            elif not loop.is_closed():  # a producer in a thread of its own: wake the readers' loop
                loop.call_soon_threadsafe(self.wake_readers, loop)

    def exists(self, stream_id: str) -> bool:
        with self._lock:
            return stream_id in self._streams

    def cancel(self, stream_id: str) -> bool:
        with self._lock:
            stream = self._streams.get(stream_id)
            if stream is None:
                return False
            stream.cancelled = True
            return True

    def is_cancelled(self, stream_id: str) -> bool:
        with self._lock:
            stream = self._streams.get(stream_id)
            return stream is not None and stream.cancelled

    def cancelled_among(self, stream_ids: list[str]) -> set[str]:
        with self._lock:
            return {stream_id for stream_id in stream_ids if (s := self._streams.get(stream_id)) and s.cancelled}

    def events(self, stream_id: str, after: int = 0) -> list[StreamEvent]:
        with self._lock:
            return self._get(stream_id).events[after:]

    async def read(
        self, stream_id: str, after: int = 0, *, heartbeat_s: float | None = None
    ) -> AsyncIterator[list[StreamEvent]]:
        """Yield batches of events after `after` until the terminal one.

        Events that arrived while the reader was busy come as one batch, so a slow
        reader catches up instead of falling behind. An empty batch means
        `heartbeat_s` passed with nothing new.
        """
        loop = asyncio.get_running_loop()
        cursor = after
        while True:
            waiter = None
            with self._lock:
                stream = self._get(stream_id)
                batch = stream.events[cursor:]
                if not batch and stream.finished_at is not None:
                    return  # resumed after the terminal event: nothing more will come
                if not batch:
                    waiter = asyncio.Event()
                    stream.waiters.append((loop, waiter))
            if batch:
                cursor = batch[-1].seq
                yield batch
                if batch[-1].terminal:
                    return
                continue
            assert waiter is not None
            try:
                async with asyncio.timeout(heartbeat_s):  # no Task per wait, unlike wait_for
                    await waiter.wait()
            except TimeoutError:
                yield []

    def wake_readers(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wake the readers on `loop` that appends since the last call were for: run on
        that loop, once per batch of appends (append_many) rather than once per stream."""
        with self._lock:
            waiters = self._to_wake.pop(loop, [])
        for waiter in waiters:
            waiter.set()

    def claim(self, stream_id: str, producer: str) -> bool:
        """Take an open stream for `producer` to generate, once.

        False if it is gone, has ended (e.g. settled while its generation waited) or was
        claimed before (a task delivered twice)."""
        with self._lock:
            stream = self._streams.get(stream_id)
            if stream is None or stream.finished_at is not None or stream.producer is not None:
                return False
            stream.producer = producer
            return True

    def claimants(self, stream_ids: list[str]) -> dict[str, str]:
        """The producers that claimed these streams, for those claimed."""
        with self._lock:
            streams = ((stream_id, self._streams.get(stream_id)) for stream_id in stream_ids)
            return {stream_id: stream.producer for stream_id, stream in streams if stream and stream.producer}

    def beat(self, producer: str, ttl_s: float) -> None:
        """Say that `producer` is alive for the next `ttl_s` seconds."""
        with self._lock:
            self._beats[producer] = time.monotonic() + ttl_s

    def producer_alive(self, producer: str) -> bool:
        with self._lock:
            return self._beats.get(producer, 0.0) > time.monotonic()

    def _get(self, stream_id: str) -> _Stream:
        try:
            return self._streams[stream_id]
        except KeyError:
            raise StreamNotFound(stream_id) from None

    def expire_finished(self) -> int:
        """Drop the streams past their retention now (creating a stream also does)."""
        with self._lock:
            return self._drop_expired()

    def _drop_expired(self) -> int:
        cutoff = time.monotonic() - self.retention_s
        expired = 0
        while self._finished and self._finished[0][0] < cutoff:
            _, stream_id = self._finished.popleft()
            del self._streams[stream_id]
            expired += 1
        return expired


def coalesced(events: Iterable[StreamEvent]) -> Iterator[StreamEvent]:
    """Merge each run of consecutive token events into one token event.

    The merged event carries the run's last sequence number, so a reader that resumes
    after it skips exactly the tokens it holds.
    """
    run: list[StreamEvent] = []
    for event in events:
        if event.type == "token":
            run.append(event)
            continue
        if run:
            yield _merged(run)
            run = []
        yield event
    if run:
        yield _merged(run)


def _merged(run: list[StreamEvent]) -> StreamEvent:
    data: dict[str, Any] = {"delta": "".join(e.data["delta"] for e in run)}
    if logprobs := [entry for e in run for entry in e.data.get("logprobs", ())]:
        data["logprobs"] = logprobs
    return StreamEvent(seq=run[-1].seq, type="token", data=data)
