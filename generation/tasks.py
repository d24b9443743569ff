"""Celery tasks: generations and titles on the `generation` queue, housekeeping on beat's."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from generation import services, worker
from generation.backends import reaping, runtime
from generation.backends.dispatch import GENERATE_TASK
from generation.backends.jobs import TITLE_TASK
from inference.backend import GenerationTask


@shared_task(name=GENERATE_TASK)
def generate(task: dict[str, Any]) -> str:
    """Run one generation on this worker's engine (generation/worker.py)."""
    return worker.generate(GenerationTask.from_json(task))


@shared_task(name=TITLE_TASK)
def title(answer_id: int) -> bool:
    """Give a conversation a title after its first exchange."""
    return services.conversation_title_start(answer_id=answer_id)


@shared_task(name="generation.reap_dead_runs")
def reap_dead_runs() -> int:
    """Settle as interrupted the runs of workers (or processes) that stopped beating."""
    return reaping.runs_reap()


@shared_task(name="generation.expire_streams")
def expire_streams() -> int:
    """Drop finished streams past their retention that nothing else expires."""
    return runtime.stream_store().expire_finished()
