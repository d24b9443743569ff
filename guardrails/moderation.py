"""Moderation services (OpenAI's /v1/moderations shape) as rules, on prompts and on answers.

A prompt is sent whole, once, before admission. An answer cannot wait on a round trip per
token, nor be shown before it is judged: its text is cut into pieces at sentence and line
ends (at most PIECE_MAX characters, cut at a space), each piece is sent as soon as it is
complete, on a thread pool of its own, and the producer keeps generating meanwhile. A
piece goes out only once every moderation rule judged it, in order: what readers wait for
is the rest of its sentence plus one round trip, while everything before it streams on.
Each verdict has its rule's timeout; a service that is slower, down or answers nonsense
counts as allowing the piece (fail open) or as flagging it (fail closed), as its rule
says. A block ends the answer after the pieces judged before it; a flag lets the piece
out and records it (the piece is its event's excerpt, so a redaction replaces it).

Each piece is judged alone: a service sees no more context than one sentence or so.
No Django imports here: the engine's and the model-server pool's threads run this.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

import requests

from guardrails.matching import BLOCK, Hit, RuleSpec

logger = logging.getLogger(__name__)

# A piece's length: at least PIECE_MIN characters (a list's "1. " is no sentence of its own),
# at most PIECE_MAX (within the review queue's excerpt, so that a redaction replaces all of it).
PIECE_MIN = 24
PIECE_MAX = 400
# The end of a sentence (its mark and the space after it: "3.14" is none) or of a line.
_BOUNDARY = re.compile(r"[.!?…;:](?=\s)\s*|\n+")
# Requests in flight at once, for every answer of the process together.
THREADS = 16

_local = threading.local()
_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


class ModerationFailed(Exception):
    """The service did not answer in time, or not in OpenAI's shape."""


def moderation_flagged(rule: RuleSpec, text: str) -> bool:
    """Whether the rule's service flags `text`. Raises ModerationFailed."""
    headers = {"Authorization": f"Bearer {rule.token}"} if rule.token else {}
    try:
        response = _session().post(rule.pattern, json={"input": text}, headers=headers, timeout=rule.timeout_s)
        response.raise_for_status()
        return any(bool(result["flagged"]) for result in response.json()["results"])
    except (requests.RequestException, ValueError, KeyError, TypeError) as error:
        raise ModerationFailed(str(error) or type(error).__name__) from error


def moderation_verdict(rule: RuleSpec, text: str) -> bool:
    """Whether the rule applies to `text`: flagged, or its service failed and it fails closed."""
    try:
        return moderation_flagged(rule, text)
    except ModerationFailed as error:
        return _failed(rule, str(error))


def _failed(rule: RuleSpec, why: str) -> bool:
    outcome = "allowed" if rule.fail_open else f"{rule.action}ed as if flagged"
    logger.warning("Moderation rule %r: its service failed (%s); %s", rule.name, why, outcome)
    return not rule.fail_open


def _session() -> requests.Session:
    # One per thread (a Session is not promised to be thread-safe): its connections are
    # kept alive, so a piece costs a request, not a new connection.
    session = getattr(_local, "session", None)
    if session is None:
        session = _local.session = requests.Session()
    return session


def _executor() -> ThreadPoolExecutor:
    # Made on first use, in the process that uses it: a pool made before a fork (Celery's
    # prefork workers) would have no threads in the child.
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="chatsite-moderation")
        return _pool


def piece_end(text: str) -> int:
    """Where the first piece of `text` that is complete ends (0: none is yet): after its
    last sentence or line end within PIECE_MAX characters; else, past PIECE_MAX, at a space."""
    window = text[:PIECE_MAX]
    ends = [found.end() for found in _BOUNDARY.finditer(window) if found.end() >= PIECE_MIN]
    if ends:
        return ends[-1]
    if len(text) <= PIECE_MAX:
        return 0
    space = window.rfind(" ", PIECE_MAX // 2)
    return space + 1 if space > 0 else PIECE_MAX


@dataclass
class _Piece:
    text: str
    start: int  # where it begins in the text judged
    verdicts: list[tuple[RuleSpec, Future[bool], float]]  # each rule's, with its deadline

    def judged(self) -> bool:
        now = time.monotonic()
        return all(future.done() or now >= deadline for _, future, deadline in self.verdicts)

    def applying(self) -> list[RuleSpec]:
        """The rules that apply to it, in order; waits for each verdict until its deadline."""
        rules = []
        for rule, future, deadline in self.verdicts:
            try:
                applies = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                future.cancel()  # if it has not started: a request that would come too late
                applies = _failed(rule, f"no verdict within {rule.timeout_s} s")
            if applies:
                rules.append(rule)
        return rules


class AnswerModeration:
    """Moderation rules on an answer as it streams (guardrails.matching.Moderation)."""

    def __init__(self, rules: Sequence[RuleSpec], *, executor: ThreadPoolExecutor | None = None) -> None:
        self.rules = list(rules)
        self.hits: list[Hit] = []
        self.blocked_by: Hit | None = None
        self._executor = executor
        self._tail = ""  # text not sent yet: the piece being written
        self._sent = 0
        self._pieces: deque[_Piece] = deque()  # sent, not let out yet

    def add(self, text: str) -> None:
        if self.blocked_by is not None:
            return
        self._tail += text
        while end := piece_end(self._tail):
            self._send(self._tail[:end])
            self._tail = self._tail[end:]

    def take(self) -> str:
        return self._let_out(wait=False)

    def drain(self) -> str:
        if self._tail and self.blocked_by is None:
            self._send(self._tail)
            self._tail = ""
        return self._let_out(wait=True)

    def _send(self, text: str) -> None:
        pool = self._executor or _executor()
        now = time.monotonic()
        verdicts = [(rule, pool.submit(moderation_verdict, rule, text), now + rule.timeout_s) for rule in self.rules]
        self._pieces.append(_Piece(text, self._sent, verdicts))
        self._sent += len(text)

    def _let_out(self, *, wait: bool) -> str:
        out: list[str] = []
        while self._pieces and (wait or self._pieces[0].judged()):
            piece = self._pieces.popleft()
            for rule in piece.applying():
                hit = Hit(rule, piece.start, piece.start + len(piece.text), piece.text)
                self.hits.append(hit)
                if rule.action == BLOCK:
                    self.blocked_by = hit
                    self._pieces.clear()
                    self._tail = ""
                    return "".join(out)
            out.append(piece.text)
        return "".join(out)
