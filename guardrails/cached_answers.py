"""Where the response cache keeps each stream's answer, so that the review queue can evict it.

The response cache (generation/backends/response_cache.py) keys an answer by a hash of its
request, which a stored message cannot give back. So it notes here, for every stream it
fills or serves, the key of the entry that holds the stream's text; a redaction or a
deletion in the review queue then evicts that entry, and a later identical request is
generated again (under the rules of the day) rather than replayed with the text removed.
The notes live in the same cache as the entries (Redis when REDIS_URL is set, shared by
every process) and expire with them. Here, not in the chat app: the review queue sits
below it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.core.cache import cache

logger = logging.getLogger(__name__)

NOTE_PREFIX = "policy:cached-answer:"


def cached_answer_note(*, stream_id: str, key: str, timeout: int) -> None:
    """Note that the response cache's entry `key` holds the answer of `stream_id`."""
    try:
        cache.set(NOTE_PREFIX + stream_id, key, timeout=timeout)
    except Exception:  # as the cache itself: a note that cannot be written only saves less
        logger.warning("Could not note a cached answer's stream", exc_info=True)


def cached_answers_evict(*, stream_ids: Iterable[str]) -> int:
    """Evict the response cache's entries that hold these streams' answers; how many were noted.
    Raises when the cache cannot be reached: a redaction must not pass for done."""
    notes = [NOTE_PREFIX + stream_id for stream_id in stream_ids if stream_id]
    if not notes:
        return 0
    keys = cache.get_many(notes)
    cache.delete_many([*keys.values(), *notes])
    return len(keys)
