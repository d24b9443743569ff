"""Requests per minute as a sliding window: at most `limit` requests in any 60 seconds.

A counter per calendar minute (a fixed window) lets twice the limit through around a
minute's edge: five at 12:00:59 and five more at 12:01:00. A token bucket lets a full
bucket and its refill through within one minute. Here every admitted request's time is
kept for 60 s (a sliding log) and a request is admitted while fewer than `limit` are
kept: exact, for one entry per request admitted in the last minute. Refused requests
are not kept, so a client that keeps knocking still gets in once a place frees.

On Redis the log is a sorted set that one Lua script prunes, counts and adds to, atomic
for every web process; without Redis it lives in the process, under a lock. The caller
gives the time (every web process's clock, kept by NTP), so that tests can walk it.
"""

from __future__ import annotations

import bisect
import secrets
import threading
from dataclasses import dataclass
from typing import Protocol

from django.core.cache import BaseCache, caches
from django.core.cache.backends.redis import RedisCache

WINDOW_S = 60.0


@dataclass(frozen=True)
class Window:
    """Where a key stands in its last 60 seconds."""

    admitted: bool
    count: int  # requests in the window, the admitted one included
    free_in_s: float  # until the oldest leaves the window, which frees a place (0: empty)
    empty_in_s: float  # until the newest leaves it too: the limit is whole again

    @classmethod
    def of(cls, *, admitted: bool, count: int, oldest: float, newest: float, now: float) -> Window:
        if not count:
            return cls(admitted, 0, 0.0, 0.0)
        return cls(admitted, count, max(0.0, oldest + WINDOW_S - now), max(0.0, newest + WINDOW_S - now))


class RequestLog(Protocol):
    def admit(self, key: str, *, limit: int, now: float) -> Window:
        """Count a request at `now` if fewer than `limit` were counted in the 60 s before it."""

    def look(self, key: str, *, now: float) -> Window:
        """Where `key` stands at `now`, counting nothing."""


class LocalRequestLog:
    """The log of this process, for a site without Redis (one process, like its cache)."""

    def __init__(self) -> None:
        self._times: dict[str, list[float]] = {}
        self._lock = threading.Lock()
        self._swept_at = 0.0

    def admit(self, key: str, *, limit: int, now: float) -> Window:
        with self._lock:
            self._sweep(now)
            times = self._times.setdefault(key, [])
            del times[: bisect.bisect_right(times, now - WINDOW_S)]
            admitted = len(times) < limit
            if admitted:
                bisect.insort(times, now)
            if not times:
                del self._times[key]
                return Window.of(admitted=admitted, count=0, oldest=0.0, newest=0.0, now=now)
            return Window.of(admitted=admitted, count=len(times), oldest=times[0], newest=times[-1], now=now)

    def look(self, key: str, *, now: float) -> Window:
        return self.admit(key, limit=0, now=now)

    def _sweep(self, now: float) -> None:
        """Once a minute, forget the keys whose every request has left the window."""
        if now - self._swept_at < WINDOW_S:
            return
        self._swept_at = now
        for key in [key for key, times in self._times.items() if times[-1] <= now - WINDOW_S]:
            del self._times[key]


# KEYS[1]: the sorted set of request times (ms). ARGV: now (ms), window (ms), limit, a
# unique member. Returns {admitted, count, oldest ms, newest ms}.
ADMIT_SCRIPT = """
local now, window, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local count = redis.call('ZCARD', KEYS[1])
local admitted = 0
if count < limit then
  redis.call('ZADD', KEYS[1], now, ARGV[4])
  redis.call('PEXPIRE', KEYS[1], window)
  count, admitted = count + 1, 1
end
if count == 0 then
  return {admitted, 0, 0, 0}
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]
local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2]
return {admitted, count, tonumber(oldest), tonumber(newest)}
"""


class RedisRequestLog:
    """The log in the Redis of the site's cache, under the cache's key prefix, shared by every process."""

    def __init__(self, cache: RedisCache) -> None:
        self._cache = cache

    def admit(self, key: str, *, limit: int, now: float) -> Window:
        name = self._cache.make_key(key)
        client = self._cache._cache.get_client(name, write=True)  # type: ignore[attr-defined]
        now_ms = int(now * 1000)
        args = [now_ms, int(WINDOW_S * 1000), limit, f"{now_ms}-{secrets.token_hex(6)}"]
        admitted, count, oldest, newest = client.register_script(ADMIT_SCRIPT)(keys=[name], args=args)
        return Window.of(admitted=bool(admitted), count=count, oldest=oldest / 1000, newest=newest / 1000, now=now)

    def look(self, key: str, *, now: float) -> Window:
        return self.admit(key, limit=0, now=now)


# This process's window of requests where no Redis is configured (tests give each test a new one).
local_log = LocalRequestLog()


def request_log(cache: BaseCache | None = None) -> RequestLog:
    """The log where the site's cache is: in Redis when REDIS_URL makes it a Redis cache, else in this process."""
    cache = cache or caches["default"]
    return RedisRequestLog(cache) if isinstance(cache, RedisCache) else local_log
