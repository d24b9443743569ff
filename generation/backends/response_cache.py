"""The response cache: finished answers to deterministic requests, streamed again.

A request is deterministic when it samples greedily (temperature 0) or with a fixed seed:
the same model, messages and parameters then give the same answer, so a complete one
(finish_reason stop or length, not stopped, not failed) is kept for CHAT_RESPONSE_CACHE_TTL
seconds and an identical request streams it from here instead of generating it again.

Entries live in Django's default cache: Redis when REDIS_URL is set (shared by every
process), else this process's memory. The key is a hash of the model, the prompt, every
generation parameter and, with CHAT_RESPONSE_CACHE=user (the default), the user: one
user's answers are never served to another. The cache only ever saves work: an entry
that cannot be read or written is a miss, never a failed request. Each stream filled or
served from an entry is noted with its key (guardrails.cached_answers), so that the
review queue's redaction or deletion of its text evicts the entry.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.cache import cache

from generation.backends import runtime
from guardrails.cached_answers import cached_answer_note
from inference.engine import GenerationResult
from inference.generators import GenerationParams, Prompt

logger = logging.getLogger(__name__)

KEY_PREFIX = "response-cache:v1:"
# What a finished answer must end with to be kept: complete, not cut off by a Stop or an error.
CACHEABLE_FINISH_REASONS = frozenset({"stop", "length"})


@dataclass(frozen=True)
class CachedAnswer:
    """A stored answer: its token pieces as they were streamed, so that a replay has the
    same events (and event ids) as the generation had."""

    pieces: tuple[str, ...]
    finish_reason: str
    completion_tokens: int

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @classmethod
    def from_entry(cls, entry: Any) -> CachedAnswer | None:
        """The answer in a cache entry; None for anything else (an entry of another version)."""
        if not isinstance(entry, dict):
            return None
        pieces, finish_reason, tokens = entry.get("pieces"), entry.get("finish_reason"), entry.get("completion_tokens")
        if not (isinstance(pieces, list) and all(isinstance(piece, str) for piece in pieces)):
            return None
        if finish_reason not in CACHEABLE_FINISH_REASONS or not isinstance(tokens, int):
            return None
        return cls(tuple(pieces), finish_reason, tokens)

    def entry(self) -> dict[str, Any]:
        return {
            "pieces": list(self.pieces),
            "finish_reason": self.finish_reason,
            "completion_tokens": self.completion_tokens,
        }


@dataclass(frozen=True)
class CacheLookup:
    """A cacheable request's key, and its stored answer if there is one."""

    key: str
    answer: CachedAnswer | None

    @property
    def outcome(self) -> str:
        """ "hit" or "miss": the API's x-chatsite-cache header and the ledger's mark."""
        return "miss" if self.answer is None else "hit"


def is_deterministic(params: GenerationParams) -> bool:
    return params.temperature == 0 or params.seed is not None


def response_cache_key(
    *, user_id: int | None, model: str, prompt: Prompt, params: GenerationParams, policy: Sequence[object] = ()
) -> str:
    """The key of a request: model, prompt and every generation parameter, and the user
    unless the scope is global. A parameter added to GenerationParams joins the key by itself.
    The answer rules (`policy`, guardrails) join it where there are any: an answer kept
    before a rule changed is not the answer it makes now."""
    material: dict[str, Any] = {
        "user": user_id if settings.CHAT_RESPONSE_CACHE == "user" else None,
        "model": model,
        "prompt": prompt,
        "params": dataclasses.asdict(params),
    }
    if policy:
        material["policy"] = list(policy)
    encoded = json.dumps(material, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return KEY_PREFIX + hashlib.sha256(encoded.encode()).hexdigest()


def response_cache_lookup(
    *, user_id: int, model: str, prompt: Prompt, params: GenerationParams, policy: Sequence[object] = ()
) -> CacheLookup | None:
    """The cache's answer to a request; None when the cache does not apply to it (turned
    off, or a request that samples without a seed)."""
    if settings.CHAT_RESPONSE_CACHE == "off" or not is_deterministic(params):
        return None
    key = response_cache_key(user_id=user_id, model=model, prompt=prompt, params=params, policy=policy)
    try:
        entry = cache.get(key)
    except Exception:  # e.g. Redis unreachable: generate as if nothing was stored
        logger.warning("Could not read the response cache; generating", exc_info=True)
        entry = None
    return CacheLookup(key, CachedAnswer.from_entry(entry))


def response_cache_fill(*, key: str, stream_id: str, result: GenerationResult) -> bool:
    """Keep a finished generation's answer under `key`, if it is complete; whether it was kept.

    Called by the producer before it publishes the terminal event, when every token is
    already in the stream store: the pieces are read back from there, so that a replay
    streams the same events. Should they not add up to the saved text (an event lost to
    a store that failed meanwhile), the text is kept as one piece.
    """
    if result.status != "complete" or result.finish_reason not in CACHEABLE_FINISH_REASONS:
        return False
    try:
        events = runtime.stream_store().events(stream_id)
    except Exception:
        events = []
    pieces = tuple(event.data["delta"] for event in events if event.type == "token")
    if "".join(pieces) != result.text:
        pieces = (result.text,)
    answer = CachedAnswer(pieces, result.finish_reason, result.completion_tokens)
    try:
        cache.set(key, answer.entry(), timeout=settings.CHAT_RESPONSE_CACHE_TTL)
    except Exception:
        logger.warning("Could not write the response cache", exc_info=True)
        return False
    cached_answer_note(stream_id=stream_id, key=key, timeout=settings.CHAT_RESPONSE_CACHE_TTL)
    return True


def response_cache_served(*, key: str, stream_id: str) -> None:
    """Note that `stream_id` replays the entry `key`: a redaction of its text evicts the entry."""
    cached_answer_note(stream_id=stream_id, key=key, timeout=settings.CHAT_RESPONSE_CACHE_TTL)
