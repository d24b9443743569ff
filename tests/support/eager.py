"""An engine that runs each job in the thread that submits it, start to end.

The way Celery's `task_always_eager` runs tasks: a test's request generates, saves its
answer and publishes every event before the request returns, on the test's own database
connection. The test then rolls its transaction back like any other, instead of flushing
every table (`transaction=True`) so that the engine's threads could see its rows. Not for
tests of what the threads do: queueing, Stop in mid-answer, batching, heartbeats.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from inference.engine import Engine, Job, _Run


class InlineExecutor(Executor):
    """An executor that runs what it is given at once, in the caller's thread."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as error:
            future.set_exception(error)
        return future


class EagerEngine(Engine):
    """Engine's events, saves and results, with no thread of its own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._finisher = InlineExecutor()  # progress saves and the final save, inline

    def start(self) -> None:
        if self.generator is None:
            self.generator = self._load()
            self._loaded.set()

    def submit(self, job: Job) -> None:
        self.start()
        self.store.create(job.stream_id)
        with self._lock:
            self.active += 1
        run = _Run(job, self)
        try:
            assert self.generator is not None
            outcome = self.generator.generate(job.prompt, job.params, run.on_token, run.poll_cancelled)
            final = run.finished(outcome)
        except Exception as error:
            final = run.failed(error)
        self._finish(run, final).result()

    def stop(self, timeout: float | None = None) -> None:
        self._stopping.set()
