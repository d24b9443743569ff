"""Settling runs whose producer died: the reaper's side of the chat app.

A process that dies mid-generation leaves its answers streaming; the producer's heartbeat
in the stream store lapses, and these settle them as interrupted, with their text so far.
Beat runs runs_reap() (in-process: the web process runs beat's schedule itself).
"""

from __future__ import annotations

import contextlib
import logging

from django.db import transaction

from accounts.models import UsageRecord
from accounts.services import usage_finish
from generation.backends import runtime
from generation.backends.dispatch import QUEUE_PRODUCER
from generation.backends.router import backend
from generation.models import Message
from inference.engine import INTERRUPTED
from inference.streams import StreamNotFound, StreamStore, interrupted_event

logger = logging.getLogger(__name__)


def message_mark_interrupted(message: Message) -> Message:
    """Settle an answer whose producer is gone: keep its text, mark it interrupted.

    Its stream, if still there, ends with an error event so that readers stop waiting.
    """
    settled = Message.objects.filter(pk=message.pk, status=Message.Status.STREAMING).update(
        status=Message.Status.INTERRUPTED, error=INTERRUPTED
    )
    if settled and message.stream_id:
        with contextlib.suppress(StreamNotFound, ValueError):  # gone, or ended meanwhile
            runtime.stream_store().append(message.stream_id, *interrupted_event())
    message.refresh_from_db()
    return message


def generation_abandon(*, stream_id: str, message_id: int | None) -> bool:
    """Settle as interrupted a queued generation whose stream is gone before a worker took it.

    Its stream expired while it waited, or Redis lost it: nobody reads it any more. Only a
    generation the ledger still has under the queue's name is settled; returns whether it was.
    """
    with transaction.atomic():
        record = (
            UsageRecord.objects.select_for_update()
            .filter(stream_id=stream_id, status=UsageRecord.Status.STREAMING, producer=QUEUE_PRODUCER)
            .first()
        )
        if record is None:
            return False
        _usage_interrupted(record)
        if message_id is not None:
            Message.objects.filter(pk=message_id, status=Message.Status.STREAMING).update(
                status=Message.Status.INTERRUPTED, error="The answer waited too long to be written."
            )
    return True


def messages_settle_orphans() -> int:
    """Mark interrupted the generations of producers that no longer beat.

    Their answers keep their saved text; their usage records stop counting as running
    streams (they would otherwise hold the user's concurrent-stream limit forever).
    """
    store = runtime.stream_store()
    messages = list(Message.objects.filter(status=Message.Status.STREAMING).exclude(producer=runtime.PRODUCER))
    settled = 0
    for message, dead in zip(messages, _producers_dead(store, messages), strict=True):
        if dead:
            message_mark_interrupted(message)
            settled += 1
    records = list(UsageRecord.objects.filter(status=Message.Status.STREAMING).exclude(producer=runtime.PRODUCER))
    for record, dead in zip(records, _producers_dead(store, records), strict=True):
        if not dead:
            continue
        _usage_interrupted(record)
        with contextlib.suppress(StreamNotFound, ValueError):
            store.append(record.stream_id, *interrupted_event())
    return settled


def _usage_interrupted(record: UsageRecord) -> None:
    """Settle a usage record whose generation will never finish; it no longer holds a stream."""
    usage_finish(
        stream_id=record.stream_id,
        status=Message.Status.INTERRUPTED,
        finish_reason="error",
        prompt_tokens=record.prompt_tokens,
        completion_tokens=0,  # unknown; the user is not charged for a crash
        ttft_ms=None,
        duration_ms=0,
    )


def _producers_dead(store: StreamStore, runs: list[Message] | list[UsageRecord]) -> list[bool]:
    """For each run (with its `producer` and `stream_id`), whether its producer stopped beating.

    A generation the ledger still has under the queue's name may already run on a worker,
    which claimed its stream before recording it in the ledger (worker.generate): that
    worker is the one to ask about, so a worker that dies in between is noticed too.
    """
    queued = [run.stream_id for run in runs if run.producer == QUEUE_PRODUCER and run.stream_id]
    claimed = store.claimants(queued) if queued else {}
    alive: dict[str, bool] = {}
    dead = []
    for run in runs:
        producer = claimed.get(run.stream_id or "", run.producer)
        if producer not in alive:
            alive[producer] = store.producer_alive(producer)
        dead.append(not alive[producer])
    return dead


def runs_reap() -> int:
    """Housekeeping: settle the runs of dead producers, and let the backend give back what
    runs that ended without a word still hold. Returns how many answers were settled."""
    settled = messages_settle_orphans()
    if settled:
        logger.info("Marked %d answers of stopped processes as interrupted", settled)
    backend().housekeep()
    return settled
