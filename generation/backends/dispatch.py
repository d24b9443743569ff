"""The web side of GENERATION_BACKEND=celery: admit a generation, then queue it for a worker.

Web processes hold no model. A `CeleryDispatcher` stands where the in-process `Engine`
stands (runtime.engine), with the same face for views, the API, the admin and metrics;
generation tasks go to the `generation` Celery queue, and tokens come back through the
Redis stream store.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from celery import signature
from django.db import transaction

from inference.admission import DeploymentAdmission
from inference.backend import GenerationTask
from inference.engine import BackgroundLoad, EngineOverloaded
from inference.streams import StreamStore

# The producer of a generation admitted but not yet taken by a worker. Every live worker
# beats under this name too, so a queued generation counts as alive while some worker
# can still take it, and is settled as interrupted when none is left.
QUEUE_PRODUCER = "generation-queue"
GENERATE_TASK = "generation.generate"


class CeleryDispatcher:
    scheduler = "celery"
    producer = QUEUE_PRODUCER
    generated_tokens = 0  # counted by the workers, which generate

    def __init__(
        self,
        model: str,
        load_tokenizer: Callable[[], Any],
        store: StreamStore,
        admission: DeploymentAdmission,
        *,
        enqueue: Callable[[GenerationTask], None] | None = None,
    ) -> None:
        self.model = model
        self._enqueue = enqueue or _send_to_the_queue
        self.store = store
        self.admission = admission
        # Counts prompt tokens and knows the context length; not the model's weights.
        self._loading = BackgroundLoad(load_tokenizer, what="tokenizer")
        self._started = False
        self._lock = threading.Lock()

    @property
    def generator(self) -> Any:
        return self._loading.value

    @property
    def tokenizer(self) -> Any:
        """What counts prompt tokens (no weights): the same as `generator`."""
        return self._loading.value

    @property
    def load_error(self) -> str | None:
        return self._loading.error

    @property
    def ready(self) -> bool:
        return self.generator is not None

    def wait_ready(self, timeout: float | None = None) -> bool:
        self._loading.wait(timeout)
        return self.ready

    def start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
        self._loading.thread().start()

    @property
    def max_concurrent(self) -> int:
        """Rows of the workers alive now."""
        return self.admission.state(self.model)[0]

    @property
    def active(self) -> int:
        return self.admission.queue(self.model).running

    @property
    def queued(self) -> int:
        return self.admission.queue(self.model).waiting

    def submit(self, task: GenerationTask) -> None:
        """Admit the task across all processes, then queue it once the transaction commits.

        Raises EngineOverloaded when GENERATION_MAX_QUEUE generations already wait, and
        when no generation worker is alive (none beats under QUEUE_PRODUCER): a task queued
        then would not wait for a worker but be settled as interrupted by the reaper's next
        round, which sees the queue's heartbeat gone. Refused at once instead, it is a 503
        with Retry-After that clients retry (the openai client does by itself) until a
        restarted worker beats again, and it holds no place and no quota meanwhile. A task
        that has to wait is told how many are ahead of it (a `status` event), as in-process.
        """
        if not self.store.producer_alive(QUEUE_PRODUCER):
            raise EngineOverloaded("no generation worker is alive")
        ahead = self.admission.admit(self.model, task.stream_id)
        try:
            self.store.create(task.stream_id)
            if ahead >= 0:
                self.store.append(task.stream_id, "status", {"state": "queued", "ahead": ahead})
                task = replace(task, ahead=ahead)
            # The worker reads the answer and usage rows: they must be committed first.
            transaction.on_commit(lambda: self._enqueue(task))
        except Exception:
            self.admission.release(self.model, task.stream_id)
            raise


def _send_to_the_queue(task: GenerationTask) -> None:
    # To the `generation` queue (CELERY_TASK_ROUTES). Named, not imported: the tasks
    # module reaches this one through the services.
    signature(GENERATE_TASK, args=(task.to_json(),)).delay()
