"""The engine job of a generation task, whose callbacks save what it makes.

Wherever a `GenerationTask` runs (this process's engine, a Celery worker's), `job_for`
turns it into the engine's `Job`, whose callbacks save the answer's progress, its result
and the usage record: the producer saves, not the reader.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial, wraps
from typing import Any, TypeVar

from celery import signature
from django.conf import settings
from django.db import InterfaceError, OperationalError, connections, transaction

from accounts.services import usage_finish
from generation.backends.response_cache import response_cache_fill
from generation.models import Message
from guardrails.services import answer_guard, answer_hits_record
from inference.backend import GenerationTask
from inference.engine import GenerationResult, Job
from inference.streams import GenerationStatus
from infrastructure.database import on_database_thread
from infrastructure.logs import log_generation
from infrastructure.metrics import observe_generation

TITLE_TASK = "generation.title"

T = TypeVar("T")


def job_for(task: GenerationTask, *, on_done: Callable[[GenerationResult], None] | None = None) -> Job:
    """The engine job of a task; `on_done` runs after the result is saved."""
    # Its answer rules, applied by the producer before any text reaches the stream store.
    guard = answer_guard(task.answer_rules)

    def finish(result: GenerationResult) -> None:
        if task.admission is not None and not task.admission.granted():
            return  # refused after it started: nothing was recorded
        if guard is not None:
            answer_hits_record(stream_id=task.stream_id, model=task.model, message_id=task.message_id, hits=guard.hits)
        observe_generation(task.model, result)
        log_generation(task, result)
        # The result must not be lost to a connection that died meanwhile (a terminated
        # backend, a database restart): the run would count as streaming for ever.
        retried_on_a_new_connection(partial(_result_save, task, result))
        if task.cache_key is not None and _granted_in_full(task):
            response_cache_fill(key=task.cache_key, stream_id=task.stream_id, result=result)
        if on_done:
            on_done(result)

    on_progress = partial(message_save_progress, task.message_id) if task.message_id is not None else None
    return Job(
        stream_id=task.stream_id,
        prompt=task.prompt,
        params=task.params,
        on_progress=engine_thread_task(on_progress) if on_progress else None,
        on_finish=engine_thread_task(finish),
        ahead=task.ahead,
        priority=task.priority,
        owner=task.owner,
        text_filter=guard,
    )


def _granted_in_full(task: GenerationTask) -> bool:
    """Whether a task that started before its admission was written (a model server's)
    was granted the max_tokens its cache key names, not fewer (the day's budget)."""
    return task.admission is None or task.admission.max_tokens == task.params.max_tokens


def _result_save(task: GenerationTask, result: GenerationResult) -> None:
    usage_finish(
        stream_id=task.stream_id,
        usage_estimated=result.usage_estimated,
        tool_calls=result.tool_calls,
        **result.outcome_fields(),
    )
    if task.message_id is not None:
        message_finish(task.message_id, result)
        if result.status == GenerationStatus.COMPLETE and settings.CHAT_AUTO_TITLE:
            _title_if_first(task.message_id)


def retried_on_a_new_connection(write: Callable[[], T]) -> T:
    """Run a database write, and once more on a new connection if the connection died
    under it. Only for writes that may run twice (updates to final values)."""
    try:
        return write()
    except (InterfaceError, OperationalError):
        connections.close_all()
        return write()


def message_save_progress(message_id: int, text: str) -> None:
    """Save the text so far of a streaming answer."""
    Message.objects.filter(pk=message_id, status=Message.Status.STREAMING).update(content=text)


def message_finish(message_id: int, result: GenerationResult) -> None:
    """Save a finished answer with its usage and timings."""
    Message.objects.filter(pk=message_id).update(content=result.text, error=result.error, **result.outcome_fields())


def _title_if_first(answer_id: int) -> None:
    """After a conversation's first answer, a Celery task asks the model for its title.

    Named, not imported: the tasks module calls the services that start generations, so
    importing it here would close a circle."""
    transaction.on_commit(lambda: signature(TITLE_TASK, args=(answer_id,)).delay())


def engine_thread_task(function: Callable[..., None]) -> Callable[..., None]:
    """Run a write from an engine's thread on a database thread, which keeps its connection.

    The engine's threads live as long as the process: their own connection would be held
    open between generations, or opened and closed for each save (a millisecond or more of
    every generation, measured in bench/door.py)."""

    @wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        on_database_thread(function, *args, **kwargs)

    return wrapper
