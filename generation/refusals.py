"""Why a generation could not start, said once for every channel.

The browser chat shows the words, the WebSocket sends them with the code, the API wraps
them in OpenAI's error object with the status; all three read them from `refusal_of`.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from accounts.services import InvalidRequest, QuotaExceeded
from generation.connection_limits import TooManyConnections
from inference.engine import EngineOverloaded
from inference.registry import UnknownModel

# Redis (stream store, rate limits, admission, broker) down or restarting: a 503 to retry,
# like a full queue, not a 500. Redis clients reconnect by themselves once it is back.
UNREACHABLE = (RedisConnectionError, RedisTimeoutError)
# What can refuse to start a generation.
REFUSALS = (InvalidRequest, QuotaExceeded, EngineOverloaded, UnknownModel, *UNREACHABLE)
BUSY_RETRY_AFTER_S = 5


@dataclass(frozen=True)
class Refusal:
    status: int
    code: str | None
    message: str
    param: str | None = None
    retry_after: int | None = None  # None: trying again won't help

    @property
    def words(self) -> str:
        """The message for people, with when to try again."""
        if self.status == 429 and self.retry_after is not None:
            return f"{self.message} Try again in {_duration(self.retry_after)}."
        return self.message


def refusal_of(error: Exception) -> Refusal:
    """The refusal an exception of REFUSALS (or TooManyConnections) stands for."""
    if isinstance(error, InvalidRequest):
        return Refusal(400, error.code, error.message, error.param)
    if isinstance(error, QuotaExceeded):
        return Refusal(429, error.code, error.message, error.param, error.retry_after)
    if isinstance(error, TooManyConnections):
        # Not a refusal of a generation: of one more connection, past a per-user limit.
        return Refusal(429, "too_many_connections", error.message, retry_after=BUSY_RETRY_AFTER_S)
    if isinstance(error, UnknownModel):
        return Refusal(404, "model_not_found", str(error), "model")
    if isinstance(error, UNREACHABLE):
        return Refusal(
            503,
            "server_overloaded",
            "The server cannot reach a service it needs right now. Try again in a moment.",
            retry_after=BUSY_RETRY_AFTER_S,
        )
    return Refusal(
        503, "server_overloaded", "The server is busy right now. Try again in a moment.", retry_after=BUSY_RETRY_AFTER_S
    )


def _duration(seconds: int) -> str:
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{round(seconds / 3600)} h"
