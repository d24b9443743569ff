"""How many connections one user may hold open, and how fast a chat WebSocket may talk.

- `streams` and `sockets` count each user's open event streams (the browser's answer
  streams and the API's streamed completions and resumes) and chat WebSockets, against
  CHAT_MAX_STREAMS_PER_USER and CHAT_MAX_SOCKETS_PER_USER. `hold` takes a place or
  refuses with `TooManyConnections`; the place is given back when its holder is done with
  it (`release`, or the end of a `with`), and at the latest when the holder is garbage
  collected, so a response that was never sent cannot keep a place for ever.
- The counts are per web process, in memory, keyed by user id: with several daphne
  processes behind a balancer a user may hold that many in each. They guard the
  process's memory and file descriptors, which are per process too.
- `MessageRate` is a socket's token bucket over the messages its client sends
  (CHAT_SOCKET_MESSAGES_PER_S, CHAT_SOCKET_MESSAGE_BURST), with what to do with each.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import AsyncIterator, Callable
from types import TracebackType

from django.conf import settings


class TooManyConnections(Exception):
    """A user already holds as many connections of a kind as they may."""

    def __init__(self, kind: str, limit: int) -> None:
        self.kind, self.limit = kind, limit
        super().__init__(self.message)

    @property
    def message(self) -> str:
        return f"Too many open {self.kind}: at most {self.limit} per user."


class Held:
    """One connection's place under its user's limit; given back once, however it ends."""

    def __init__(self, counter: ConnectionCounter, user_id: int) -> None:
        self._counter, self._user_id = counter, user_id
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._counter._give_back(self._user_id)

    def __enter__(self) -> Held:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


class ConnectionCounter:
    """Open connections of one kind per user, in this process; `hold` refuses past the limit."""

    def __init__(self, kind: str, limit: Callable[[], int]) -> None:
        self.kind = kind
        self._limit = limit  # read at each hold: settings can change under tests
        self._open: dict[int, int] = {}
        # Views, consumers and a Held's __del__ may run on different threads.
        self._lock = threading.Lock()

    def hold(self, user_id: int) -> Held:
        """A place for one more connection of `user_id`'s; TooManyConnections if none is left."""
        limit = self._limit()
        with self._lock:
            held = self._open.get(user_id, 0)
            if held >= limit:
                raise TooManyConnections(self.kind, limit)
            self._open[user_id] = held + 1
        return Held(self, user_id)

    def open_for(self, user_id: int) -> int:
        return self._open.get(user_id, 0)

    def _give_back(self, user_id: int) -> None:
        with self._lock:
            left = self._open.get(user_id, 0) - 1
            if left > 0:
                self._open[user_id] = left
            else:
                self._open.pop(user_id, None)


streams = ConnectionCounter("event streams", lambda: settings.CHAT_MAX_STREAMS_PER_USER)
sockets = ConnectionCounter("chat sockets", lambda: settings.CHAT_MAX_SOCKETS_PER_USER)


async def held_open(held: Held, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A response's chunks, with its place held until they end or the client leaves."""
    with held:
        async for chunk in chunks:
            yield chunk


class Verdict(enum.Enum):
    ACCEPT = "accept"
    WARN = "warn"  # the first message over the rate: refused, and the client is told so
    DROP = "drop"  # refused without a word: the client was told
    CLOSE = "close"  # the flood goes on: close the socket


class MessageRate:
    """A token bucket over one socket's incoming messages, and what to do with each.

    `burst` messages may come at once, then `rate` a second. The first message over the
    rate is refused with a warning, the next ones silently; once another burst's worth
    has been refused before the bucket filled up again, the flood is not a slip: CLOSE.
    Replies are then bounded by the rate too, whatever the client sends.
    """

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens = float(burst)
        self._last = clock()
        self._refused = 0  # since the bucket was last full

    @classmethod
    def from_settings(cls) -> MessageRate:
        return cls(settings.CHAT_SOCKET_MESSAGES_PER_S, settings.CHAT_SOCKET_MESSAGE_BURST)

    def check(self) -> Verdict:
        """The verdict on one more message, arriving now."""
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens >= self.burst:
            self._refused = 0
        if self._tokens >= 1:
            self._tokens -= 1
            return Verdict.ACCEPT
        self._refused += 1
        if self._refused == 1:
            return Verdict.WARN
        return Verdict.CLOSE if self._refused > self.burst else Verdict.DROP

    @property
    def words(self) -> str:
        """What the warning says."""
        return (
            f"Too many messages: at most {self.rate:g} a second (bursts of {self.burst}). "
            "This one was dropped; keep sending this fast and the socket is closed."
        )
