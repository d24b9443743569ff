"""Admission across processes: one bound on running plus waiting generations, in Redis.

With GENERATION_BACKEND=celery every web process admits generations here before queueing
them, so `GENERATION_MAX_QUEUE` holds for the whole deployment, not per process. Workers
register the rows they can run (their engine's `max_concurrent`) with a time to live, so
the capacity is that of the workers alive now.

Keys, under `prefix`, per model:
    {prefix}:admitted:{model}   sorted set of admitted, unfinished stream ids (score: admission time)
    {prefix}:workers:{model}    sorted set of live workers (score: when their registration lapses)
    {prefix}:capacity:{model}   hash: worker -> rows it runs at once
No Django imports here.
"""

from __future__ import annotations

import redis

from inference.backend import DeploymentQueue
from inference.engine import EngineOverloaded

# Redis time in ms, so that every process compares lapses on one clock.
_NOW = "local t = redis.call('TIME') local now = t[1] * 1000 + math.floor(t[2] / 1000)"

# KEYS: workers, capacity. Leaves `capacity` = the rows of the workers alive now.
_CAPACITY = (
    _NOW
    + """
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  redis.call('HDEL', KEYS[2], gone)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local capacity = 0
for _, worker in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  capacity = capacity + tonumber(redis.call('HGET', KEYS[2], worker) or '0')
end
"""
)

# KEYS: workers, capacity, admitted. ARGV: stream id, max queue.
# Returns {admitted (0/1), generations ahead of it (negative: a row is free)}.
_ADMIT = (
    _CAPACITY
    + """
local ahead = redis.call('ZCARD', KEYS[3]) - capacity
if ahead >= tonumber(ARGV[2]) then return {0, ahead} end
redis.call('ZADD', KEYS[3], 'NX', now, ARGV[1])
return {1, ahead}
"""
)

# KEYS: workers, capacity, admitted. Returns {capacity, admitted}.
_STATE = _CAPACITY + "return {capacity, redis.call('ZCARD', KEYS[3])}"

# KEYS: workers, capacity. ARGV: worker, rows, ttl ms.
_REGISTER = (
    _NOW
    + """
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
"""
)


class DeploymentAdmission:
    """The deployment-wide bound on running plus waiting generations, shared by every web
    process through Redis (GENERATION_BACKEND=celery)."""

    def __init__(self, url: str, *, prefix: str = "chatsite", max_queue: int = 64) -> None:
        self.prefix = prefix
        self.max_queue = max_queue
        self._redis = redis.Redis.from_url(url, decode_responses=True)
        self._admit = self._redis.register_script(_ADMIT)
        self._state = self._redis.register_script(_STATE)
        self._register = self._redis.register_script(_REGISTER)

    def _keys(self, model: str) -> list[str]:
        return [f"{self.prefix}:{name}:{model}" for name in ("workers", "capacity", "admitted")]

    def admit(self, model: str, stream_id: str) -> int:
        """Count a generation in; returns how many are ahead of it (negative: none wait).

        Raises EngineOverloaded when `max_queue` generations already wait for a row."""
        admitted, ahead = self._admit(keys=self._keys(model), args=[stream_id, self.max_queue])
        if not admitted:
            raise EngineOverloaded(f"{ahead} generations are already waiting")
        return int(ahead)

    def release(self, model: str, stream_id: str) -> None:
        self._redis.zrem(self._keys(model)[2], stream_id)

    def register(self, model: str, worker: str, rows: int, ttl_s: float) -> None:
        """A worker's heartbeat: it runs `rows` generations at once for the next `ttl_s`."""
        self._register(keys=self._keys(model)[:2], args=[worker, rows, round(ttl_s * 1000)])

    def state(self, model: str) -> tuple[int, int]:
        """(rows of the live workers, generations admitted and unfinished)."""
        capacity, admitted = self._state(keys=self._keys(model))
        return int(capacity), int(admitted)

    def queue(self, model: str) -> DeploymentQueue:
        """Generations of `model` running and waiting across the deployment."""
        capacity, admitted = self.state(model)
        return DeploymentQueue.of(model, rows=capacity, admitted=admitted)

    def admitted(self, model: str, *, older_than_s: float = 0) -> list[str]:
        """Stream ids admitted at least `older_than_s` ago and not released."""
        seconds, microseconds = self._redis.time()
        before_ms = seconds * 1000 + microseconds // 1000 - older_than_s * 1000
        admitted: list[str] = self._redis.zrangebyscore(self._keys(model)[2], "-inf", before_ms)  # type: ignore[assignment]
        return admitted

    def models(self) -> list[str]:
        """Models with admitted generations (for the reaper's sweep)."""
        head = f"{self.prefix}:admitted:"
        return [key[len(head) :] for key in self._redis.scan_iter(match=f"{head}*", count=1000)]
