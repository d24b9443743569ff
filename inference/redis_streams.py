"""A `StreamStore` on Redis Streams, shared by every process that reaches the same Redis.

Keys, under `prefix`:
    {prefix}:stream:{id}       a Redis Stream; entry `0-<seq>` holds `type` and JSON `data`
    {prefix}:stream:{id}:meta  a hash: `last_seq`, `finished`, `cancelled`
    {prefix}:producer:{name}   a heartbeat key that lives `ttl_s` after each beat

Producer-side calls (`create`, `append`, `cancel`, ...) use a sync client and may come from
any thread; `read` uses a `redis.asyncio` client per event loop. No Django imports here.
"""

from __future__ import annotations

import asyncio
import json
import threading
import weakref
from collections.abc import AsyncIterator
from typing import Any

import redis
import redis.asyncio as aredis
from redis.exceptions import NoScriptError

from inference.streams import TERMINAL_EVENTS, StreamEvent, StreamNotFound

# A stream whose producer never sends its terminal event still goes away, a day later.
ABANDONED_TTL_S = 24 * 3600
# With no heartbeat asked for, readers still wake this often to notice an expired stream.
IDLE_BLOCK_S = 15.0
# XREAD/XRANGE hand over everything available as one batch: a slow reader catches up at once.
BATCH_COUNT = 100_000

_NOT_FOUND = -1
_ALREADY_ENDED = -2

# KEYS: meta, stream. ARGV: abandoned_ttl_ms.
# Create only once, like dict.setdefault: creating again must not revive or reset a stream.
_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'last_seq', 0, 'finished', 0, 'cancelled', 0)
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return 0
"""

# KEYS: meta, stream. ARGV: type, json data, maxlen, terminal (0/1), retention_ms, abandoned_ttl_ms.
# One script, so the check, numbering, XADD and expiry can't interleave with another producer.
_APPEND = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if redis.call('HGET', KEYS[1], 'finished') == '1' then return -2 end
local seq = redis.call('HINCRBY', KEYS[1], 'last_seq', 1)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '0-' .. seq, 'type', ARGV[1], 'data', ARGV[2])
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[1], 'finished', 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
elseif seq == 1 then
  -- The stream key only exists from its first entry on, so it gets its TTL here.
  redis.call('PEXPIRE', KEYS[2], ARGV[6])
end
return seq
"""

# KEYS: meta. ARGV: producer. 1: claimed for it; 0: gone, ended or claimed before.
_CLAIM = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HGET', KEYS[1], 'finished') == '1' then return 0 end
return redis.call('HSETNX', KEYS[1], 'producer', ARGV[1])
"""

# KEYS: meta. HSET on a missing key would create a meta hash with no TTL, so check first.
_CANCEL = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'cancelled', 1)
return 1
"""


class RedisStreamStore:
    """Streams in Redis, kept `retention_s` seconds after their terminal event.

    Same contract as `InMemoryStreamStore`, across processes: events are numbered 1, 2, 3...
    per stream, nothing follows a terminal event, and any reader in any process sees them all.
    Each stream keeps at most about `maxlen` events.
    """

    local = False

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "chatsite",
        retention_s: float = 600.0,
        maxlen: int = 10_000,
        max_connections: int = 2000,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.retention_s = retention_s
        self.maxlen = maxlen
        self.max_connections = max_connections
        # RESP2 pinned: the XREAD/XRANGE reply shapes parsed below are RESP2's.
        self._redis = redis.Redis.from_url(url, decode_responses=True, protocol=2)
        self._create = self._redis.register_script(_CREATE)
        self._append = self._redis.register_script(_APPEND)
        self._cancel = self._redis.register_script(_CANCEL)
        self._claim = self._redis.register_script(_CLAIM)
        # One async client per event loop: a redis.asyncio connection belongs to the loop
        # that opened it. Weak keys, so a closed and dropped loop takes its client with it.
        self._async_lock = threading.Lock()
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aredis.Redis] = weakref.WeakKeyDictionary()

    def stream_key(self, stream_id: str) -> str:
        return f"{self.prefix}:stream:{stream_id}"

    def meta_key(self, stream_id: str) -> str:
        return f"{self.prefix}:stream:{stream_id}:meta"

    def producer_key(self, producer: str) -> str:
        return f"{self.prefix}:producer:{producer}"

    def create(self, stream_id: str) -> None:
        """Make the stream exist (before any event); creating it again changes nothing."""
        self._create(keys=[self.meta_key(stream_id), self.stream_key(stream_id)], args=[ABANDONED_TTL_S * 1000])

    def append(self, stream_id: str, type: str, data: dict[str, Any]) -> int:
        """Add one event and return its sequence number.

        Raises `StreamNotFound` for an unknown stream and `ValueError` after a terminal event.
        """
        outcome = _appended(stream_id, self._append(**self._append_call(stream_id, type, data)))
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def append_many(self, events: list[tuple[str, str, dict[str, Any]]]) -> list[int | Exception]:
        """`append` for each (stream id, type, data), in order, in one round trip: each
        one's sequence number, or the error that one raised; the others still go in.

        A batch step publishes every row's token this way: one round trip per step
        instead of one per row and token."""
        calls = [self._append_call(*event) for event in events]
        try:
            results = self._evalsha_all(calls)
        except NoScriptError:  # Redis restarted and forgot its scripts: load it again, once
            self._redis.script_load(_APPEND)
            results = self._evalsha_all(calls)
        return [_appended(event[0], result) for event, result in zip(events, results, strict=True)]

    def _evalsha_all(self, calls: list[dict[str, Any]]) -> list[Any]:
        # EVALSHA by hand: a pipeline given the Script object asks SCRIPT EXISTS first,
        # a second round trip every step.
        pipe = self._redis.pipeline(transaction=False)
        for call in calls:
            pipe.evalsha(self._append.sha, len(call["keys"]), *call["keys"], *call["args"])
        return pipe.execute()

    def _append_call(self, stream_id: str, type: str, data: dict[str, Any]) -> dict[str, Any]:
        return {
            "keys": [self.meta_key(stream_id), self.stream_key(stream_id)],
            "args": [
                type,
                json.dumps(data, separators=(",", ":")),
                self.maxlen,
                1 if type in TERMINAL_EVENTS else 0,
                _ms(self.retention_s),
                ABANDONED_TTL_S * 1000,
            ],
        }

    def exists(self, stream_id: str) -> bool:
        return bool(self._redis.exists(self.meta_key(stream_id)))

    def cancel(self, stream_id: str) -> bool:
        """Flag the stream as cancelled; False if there is no such stream."""
        return bool(self._cancel(keys=[self.meta_key(stream_id)]))

    def is_cancelled(self, stream_id: str) -> bool:
        # Called every decoding step: one HGET, one round trip.
        return self._redis.hget(self.meta_key(stream_id), "cancelled") == "1"

    def cancelled_among(self, stream_ids: list[str]) -> set[str]:
        # A batch checks all its rows every decoding step: one round trip for all of them.
        pipe = self._redis.pipeline(transaction=False)
        for stream_id in stream_ids:
            pipe.hget(self.meta_key(stream_id), "cancelled")
        return {stream_id for stream_id, flag in zip(stream_ids, pipe.execute(), strict=True) if flag == "1"}

    def events(self, stream_id: str, after: int = 0) -> list[StreamEvent]:
        pipe = self._redis.pipeline(transaction=True)
        pipe.exists(self.meta_key(stream_id))
        pipe.xrange(self.stream_key(stream_id), f"0-{after + 1}", "+")
        exists, entries = pipe.execute()
        if not exists:
            raise StreamNotFound(stream_id)
        return [_event(entry_id, fields) for entry_id, fields in entries]

    async def read(
        self, stream_id: str, after: int = 0, *, heartbeat_s: float | None = None
    ) -> AsyncIterator[list[StreamEvent]]:
        """Yield batches of events after `after` until the terminal one.

        Events that arrived while the reader was busy come as one batch, so a slow reader
        catches up instead of falling behind. An empty batch means `heartbeat_s` passed with
        nothing new. Raises `StreamNotFound` if the stream does not exist (or has expired).
        """
        client = self._async_client()
        meta_key, stream_key = self.meta_key(stream_id), self.stream_key(stream_id)
        # One transaction, so "finished" and the replay agree: a terminal event can't slip
        # in between and be skipped.
        pipe = client.pipeline(transaction=True)
        pipe.hget(meta_key, "finished")
        pipe.xrange(stream_key, f"0-{after + 1}", "+", count=BATCH_COUNT)
        finished, entries = await pipe.execute()
        if finished is None:
            raise StreamNotFound(stream_id)
        batch = [_event(entry_id, fields) for entry_id, fields in entries]
        if not batch and finished == "1":
            return  # resumed after the terminal event: nothing more will come
        cursor = after
        block_ms = _ms(heartbeat_s) if heartbeat_s is not None else _ms(IDLE_BLOCK_S)
        while True:
            if batch:
                cursor = batch[-1].seq
                yield batch
                if batch[-1].terminal:
                    return
            # An explicit last ID, not "$": nothing appended since the last batch is missed.
            # RESP2 reply: [[stream_key, [(entry_id, fields), ...]]], or [] when BLOCK timed out.
            reply: Any = await client.xread({stream_key: f"0-{cursor}"}, count=BATCH_COUNT, block=block_ms)
            batch = [_event(entry_id, fields) for _, entries in reply for entry_id, fields in entries]
            if batch:
                continue
            if not await client.exists(meta_key):
                raise StreamNotFound(stream_id)  # expired or deleted while we waited
            if heartbeat_s is not None:
                yield []

    def claim(self, stream_id: str, producer: str) -> bool:
        """Take an open stream for `producer` to generate, once (one script, one round trip).

        False if it is gone, has ended (e.g. settled while its generation waited) or was
        claimed before (a task delivered twice)."""
        return bool(self._claim(keys=[self.meta_key(stream_id)], args=[producer]))

    def claimants(self, stream_ids: list[str]) -> dict[str, str]:
        """The producers that claimed these streams, for those claimed (one round trip)."""
        pipe = self._redis.pipeline(transaction=False)
        for stream_id in stream_ids:
            pipe.hget(self.meta_key(stream_id), "producer")
        return {stream_id: who for stream_id, who in zip(stream_ids, pipe.execute(), strict=True) if who}

    def beat(self, producer: str, ttl_s: float) -> None:
        """Say that `producer` is alive for the next `ttl_s` seconds."""
        self._redis.set(self.producer_key(producer), "1", px=_ms(ttl_s))

    def producer_alive(self, producer: str) -> bool:
        return bool(self._redis.exists(self.producer_key(producer)))

    def expire_finished(self) -> int:
        """Give an expiry to any stream key that has none; returns how many were mended.

        Every stream expires on its own (its keys get a TTL when created, at the first
        event and at the terminal one). This sweep, run by Celery beat, catches keys
        left without one anyway (a PERSIST, a restore from a dump): a finished stream gets
        the retention time, an unfinished one the abandoned stream's day.
        """
        mended = 0
        for key in self._redis.scan_iter(match=f"{self.prefix}:stream:*", count=1000):
            if self._redis.ttl(key) != -1:
                continue  # expiring already, or gone meanwhile
            meta_key = key if key.endswith(":meta") else f"{key}:meta"
            finished = self._redis.hget(meta_key, "finished") == "1"
            self._redis.pexpire(key, _ms(self.retention_s) if finished else ABANDONED_TTL_S * 1000)
            mended += 1
        return mended

    def close(self) -> None:
        """Close the sync client's connections (async clients: `aclose` in their loop)."""
        self._redis.close()

    async def aclose(self) -> None:
        """Close the running loop's async client, if this store made one."""
        with self._async_lock:
            client = self._async.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    def _async_client(self) -> aredis.Redis:
        loop = asyncio.get_running_loop()
        with self._async_lock:
            client = self._async.get(loop)
            if client is None:
                # Every reader in this loop shares one bounded pool; past the bound a reader
                # waits for a free connection instead of opening yet another socket.
                # No socket timeout (redis-py's default is 5 s): XREAD BLOCK waits up to a
                # heartbeat (15 s) for good reason. Keepalive still finds dead connections.
                pool = aredis.BlockingConnectionPool.from_url(
                    self.url,
                    max_connections=self.max_connections,
                    timeout=30,
                    decode_responses=True,
                    protocol=2,
                    socket_timeout=None,
                    socket_keepalive=True,
                )
                client = aredis.Redis.from_pool(pool)
                self._async[loop] = client
            return client


def _appended(stream_id: str, result: Any) -> int | Exception:
    seq = int(result)
    if seq == _NOT_FOUND:
        return StreamNotFound(stream_id)
    if seq == _ALREADY_ENDED:
        return ValueError(f"stream {stream_id} already ended")
    return seq


def _event(entry_id: str, fields: dict[str, str]) -> StreamEvent:
    return StreamEvent(seq=int(entry_id.partition("-")[2]), type=fields["type"], data=json.loads(fields["data"]))


def _ms(seconds: float) -> int:
    # PX/PEXPIRE/BLOCK take whole milliseconds, and 0 would mean "never" or be refused.
    return max(1, round(seconds * 1000))
