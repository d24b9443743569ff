"""The two GenerationBackend implementations (inference/backend.py), and the one this
deployment uses, chosen once from GENERATION_BACKEND: nothing else asks which it is.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import DatabaseError, close_old_connections

from accounts.models import UsageRecord
from generation.backends import runtime
from generation.backends.dispatch import QUEUE_PRODUCER, CeleryDispatcher
from generation.backends.jobs import job_for
from generation.checks import configured_upstreams
from generation.models import UpstreamEndpoint
from inference.backend import DeploymentQueue, GenerationBackend, GenerationTask, ModelLoad
from inference.engine import EngineOverloaded
from inference.generators import ChatTokenizer, Generator, Prompt, load_chat_tokenizer
from inference.upstream import PASSTHROUGH_FIELDS, UpstreamPool, estimate_prompt_tokens

logger = logging.getLogger(__name__)


def _loaded(holder: Any) -> ChatTokenizer | Generator:
    """What counts an engine's (or dispatcher's) prompt tokens (an engine whose model left
    memory while idle keeps its tokenizer); EngineOverloaded while it loads."""
    if holder.tokenizer is None:
        raise EngineOverloaded(f"the model is not loaded ({holder.load_error or 'loading'})")
    return holder.tokenizer  # type: ignore[no-any-return]


def _real_tokenizer(holder: ChatTokenizer | Generator | None) -> ChatTokenizer | None:
    """A model's tokenizer; None for the synthetic model, which only estimates its counts."""
    return holder if isinstance(holder, ChatTokenizer) else None


class InProcessBackend:
    """Generations run on this process's own engines (GENERATION_BACKEND=inprocess)."""

    def models(self) -> list[str]:
        return runtime.model_names()

    def features(self, model: str) -> frozenset[str]:
        return frozenset()

    def producer(self, model: str) -> str:
        return runtime.local_engine(model).producer

    def count_prompt_tokens(self, model: str, prompt: Prompt) -> int:
        return _loaded(runtime.local_engine(model)).count_prompt_tokens(prompt)

    def context_length(self, model: str) -> int:
        return _loaded(runtime.local_engine(model)).context_length

    def tokenizer(self, model: str) -> ChatTokenizer | None:
        return _real_tokenizer(_loaded(runtime.local_engine(model)))

    def submit(self, task: GenerationTask) -> str:
        runtime.local_engine(task.model).submit(job_for(task))
        return task.stream_id

    def starts_early(self, model: str) -> bool:
        return False  # the engine sizes a run by its max_tokens when it takes it

    def ready(self) -> bool:
        return runtime.local_engine().ready

    def wait_ready(self, timeout: float | None = None) -> bool:
        return runtime.local_engine().wait_ready(timeout)

    def not_ready_reason(self) -> str:
        engine = runtime.local_engine()
        return "stopping" if engine.stopping else engine.load_error or "loading"

    def shut_down(self, grace_s: float) -> None:
        in_parallel(*(partial(engine.shut_down, grace_s) for engine in runtime.local_engines().values()))

    def loads(self) -> list[ModelLoad]:
        return [
            ModelLoad(
                model, e.scheduler, e.ready, e.active, e.queued, e.max_concurrent, e.generated_tokens, loaded=e.loaded
            )
            for model, e in sorted(runtime.local_engines().items())
        ]

    def deployment_queues(self) -> list[DeploymentQueue]:
        return []  # each process admits to its own engines

    def start(self) -> None:
        runtime.local_engine()
        threading.Thread(target=_housekeep_inline, name="chatsite-housekeeping", daemon=True).start()

    def housekeep(self) -> None:
        """Nothing of its own: the reaper settles the runs of dead processes for every backend."""


class CeleryBackend:
    """Generations run on Celery workers (GENERATION_BACKEND=celery).

    Web processes hold only each model's tokenizer, to count prompt tokens, and admit
    generations across all processes in Redis before queueing them (generation/backends/dispatch.py).
    """

    def __init__(self, dispatchers: dict[str, CeleryDispatcher] | None = None) -> None:
        self._dispatchers = dict(dispatchers or {})
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def dispatcher(self, model: str | None = None) -> CeleryDispatcher:
        """The dispatcher of `model` (default CHAT_MODEL), its tokenizer loading; raises UnknownModel."""
        name = model or settings.CHAT_MODEL
        with self._lock:
            if name not in self._dispatchers:
                load = partial(
                    load_chat_tokenizer,
                    runtime.model_spec(name),
                    cache_dir=settings.MODEL_CACHE_DIR,
                    synthetic_tokens_per_s=settings.CHAT_SYNTHETIC_TOKENS_PER_S,
                )
                self._dispatchers[name] = CeleryDispatcher(name, load, runtime.stream_store(), runtime.admission())
            found = self._dispatchers[name]
        found.start()
        return found

    def models(self) -> list[str]:
        return runtime.model_names()

    def features(self, model: str) -> frozenset[str]:
        return frozenset()

    def producer(self, model: str) -> str:
        return QUEUE_PRODUCER  # until a worker claims it (generation/worker.py)

    def count_prompt_tokens(self, model: str, prompt: Prompt) -> int:
        return _loaded(self.dispatcher(model)).count_prompt_tokens(prompt)

    def context_length(self, model: str) -> int:
        return _loaded(self.dispatcher(model)).context_length

    def tokenizer(self, model: str) -> ChatTokenizer | None:
        return _real_tokenizer(_loaded(self.dispatcher(model)))

    def submit(self, task: GenerationTask) -> str:
        if self._stopping.is_set():
            raise EngineOverloaded("the server is shutting down")
        self.dispatcher(task.model).submit(task)
        return task.stream_id

    def starts_early(self, model: str) -> bool:
        return False  # a worker claims the run's ledger record before it generates

    def ready(self) -> bool:
        return self.dispatcher().ready and not self._stopping.is_set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self.dispatcher().wait_ready(timeout)

    def not_ready_reason(self) -> str:
        return "stopping" if self._stopping.is_set() else self.dispatcher().load_error or "loading"

    def shut_down(self, grace_s: float) -> None:
        """Refuse new generations; those queued and running are the workers' to finish."""
        self._stopping.set()

    def loads(self) -> list[ModelLoad]:
        with self._lock:
            dispatchers = sorted(self._dispatchers.items())
        return [
            ModelLoad(model, d.scheduler, d.ready, d.active, d.queued, d.max_concurrent, d.generated_tokens)
            for model, d in dispatchers
        ]

    def deployment_queues(self) -> list[DeploymentQueue]:
        """Every model the workers serve, asked or not in this process: a scaler reading any
        one web process sees them all."""
        admission = runtime.admission()
        return [admission.queue(model) for model in self.models()]

    def start(self) -> None:
        self.dispatcher()

    def housekeep(self) -> None:
        """Give back the admission places of runs that are no longer streaming.

        Their worker died, or queueing them failed. A place is given back once it is a
        minute old, past any transaction that may still be committing its usage record.
        """
        admission = runtime.admission()
        for model in admission.models():
            admitted = admission.admitted(model, older_than_s=60)
            streaming = set(
                UsageRecord.objects.filter(stream_id__in=admitted, status=UsageRecord.Status.STREAMING).values_list(
                    "stream_id", flat=True
                )
            )
            for stream_id in set(admitted) - streaming:
                admission.release(model, stream_id)


class UpstreamBackend:
    """Generations on model servers of their own (CHAT_UPSTREAMS and the admin's endpoints).

    This process streams them (inference/upstream/); their tokens go through the stream
    store like any other, so any web process serves, resumes or stops them. Endpoints
    saved in the admin are picked up within REFRESH_S.
    """

    REFRESH_S = 5.0

    def __init__(self) -> None:
        self.pool = UpstreamPool(
            runtime.stream_store(), producer=runtime.PRODUCER, max_queue=settings.GENERATION_MAX_QUEUE
        )
        self._refreshed_at = -math.inf
        self._lock = threading.Lock()
        self._tokenizers: dict[str, ChatTokenizer | Generator] = {}

    def refresh(self, *, force: bool = False) -> None:
        """Serve the endpoints configured now (the environment's and the enabled ones in the admin)."""
        with self._lock:
            if not force and time.monotonic() - self._refreshed_at < self.REFRESH_S:
                return
            self._refreshed_at = time.monotonic()
        try:
            saved = [row.as_endpoint() for row in UpstreamEndpoint.objects.filter(enabled=True)]
        except DatabaseError:  # a database hiccup must not take the other models down with it
            logger.warning("Could not read the upstream endpoints; serving the ones known", exc_info=True)
            return
        self.pool.configure([*configured_upstreams(), *saved])

    def models(self) -> list[str]:
        self.refresh()
        return self.pool.models()

    def features(self, model: str) -> frozenset[str]:
        return frozenset(PASSTHROUGH_FIELDS)

    def producer(self, model: str) -> str:
        return runtime.PRODUCER

    def count_prompt_tokens(self, model: str, prompt: Prompt) -> int:
        # Model servers keep their tokenizers: without one configured here, an estimate
        # reserves the budget, and the server's usage report settles it.
        tokenizer = self._tokenizer(model)
        return tokenizer.count_prompt_tokens(prompt) if tokenizer else estimate_prompt_tokens(prompt)

    def _tokenizer(self, model: str) -> ChatTokenizer | Generator | None:
        """The tokenizer configured for `model`'s endpoints, loaded once; None without one."""
        self.refresh()
        name = next((e.tokenizer for e in self.pool.endpoints(model) if e.tokenizer), None)
        if name is None:
            return None
        with self._lock:
            if name not in self._tokenizers:
                self._tokenizers[name] = load_chat_tokenizer(
                    runtime.model_spec(name),
                    cache_dir=settings.MODEL_CACHE_DIR,
                    synthetic_tokens_per_s=settings.CHAT_SYNTHETIC_TOKENS_PER_S,
                )
            return self._tokenizers[name]

    def tokenizer(self, model: str) -> ChatTokenizer | None:
        # Without one configured, the model server's own /tokenize is the one to ask.
        return _real_tokenizer(self._tokenizer(model))

    def context_length(self, model: str) -> int:
        self.refresh()
        lengths = [e.context_length for e in self.pool.endpoints(model) if e.context_length]
        return min(lengths, default=UNKNOWN_CONTEXT_LENGTH)

    def submit(self, task: GenerationTask) -> str:
        params = task.params
        body: dict[str, Any] = {
            "messages" if isinstance(task.prompt, list) else "prompt": task.prompt,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            **({"seed": params.seed} if params.seed is not None else {}),
            **({"stop": list(params.stop)} if params.stop else {}),
            # An empty tools list only marks a tool round trip; servers refuse it as a value.
            **{name: value for name, value in params.extra.items() if value != []},
        }
        tokenizer = self._tokenizer(task.model)
        self.pool.submit(
            job_for(task),
            model=task.model,
            # Counted once, at admission; a task from elsewhere may come uncounted.
            prompt_tokens=(
                task.prompt_tokens
                if task.prompt_tokens is not None
                else self.count_prompt_tokens(task.model, task.prompt)
            ),
            body=body,
            count_tokens=(lambda text: tokenizer.count_prompt_tokens(text)) if tokenizer else None,
            admission=task.admission,
            tools=task.tools,
        )
        return task.stream_id

    def starts_early(self, model: str) -> bool:
        # The server reads the prompt while the ledger writes: the first token waits for
        # the slower of the two, not for both.
        return True

    def ready(self) -> bool:
        return True

    def wait_ready(self, timeout: float | None = None) -> bool:
        return True

    def not_ready_reason(self) -> str:
        return ""

    def shut_down(self, grace_s: float) -> None:
        self.pool.shut_down(grace_s)

    def loads(self) -> list[ModelLoad]:
        loads = []
        for model in self.pool.models():
            active, queued, rows = self.pool.load(model)
            loads.append(ModelLoad(model, "upstream", True, active, queued, rows, self.pool.generated_tokens))
        return loads

    def deployment_queues(self) -> list[DeploymentQueue]:
        return []  # the model servers export their own queues

    def start(self) -> None:
        self.refresh(force=True)

    def serve_on_running_loop(self) -> None:
        """Stream on the web server's loop (UpstreamPool.serve_on_running_loop) where the
        stream store is this process's memory. A shared store's appends are network round
        trips, which must not stall the web server's loop: its pool keeps a thread."""
        if self.pool.store.local:
            self.pool.serve_on_running_loop()

    def housekeep(self) -> None:
        """Nothing of its own: a dead process's upstream runs are settled by the reaper."""


# A model server's context when it is not configured: it refuses what doesn't fit itself.
UNKNOWN_CONTEXT_LENGTH = 1_000_000


class ModelRouter:
    """The deployment's backend: each model's requests go where that model is served.

    Models of the upstream endpoints go to them; every other model to this deployment's
    own backend (in-process or Celery), which also serves the default model."""

    def __init__(self, own: GenerationBackend, upstream: UpstreamBackend) -> None:
        self.own, self.upstream = own, upstream

    def _for(self, model: str) -> GenerationBackend:
        return self.upstream if model in self.upstream.models() else self.own

    def models(self) -> list[str]:
        own = self.own.models()
        return [*own, *(model for model in self.upstream.models() if model not in own)]

    def features(self, model: str) -> frozenset[str]:
        return self._for(model).features(model)

    def producer(self, model: str) -> str:
        return self._for(model).producer(model)

    def count_prompt_tokens(self, model: str, prompt: Prompt) -> int:
        return self._for(model).count_prompt_tokens(model, prompt)

    def context_length(self, model: str) -> int:
        return self._for(model).context_length(model)

    def tokenizer(self, model: str) -> ChatTokenizer | None:
        return self._for(model).tokenizer(model)

    def submit(self, task: GenerationTask) -> str:
        return self._for(task.model).submit(task)

    def starts_early(self, model: str) -> bool:
        return self._for(model).starts_early(model)

    def ready(self) -> bool:
        return self.own.ready()

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self.own.wait_ready(timeout)

    def not_ready_reason(self) -> str:
        return self.own.not_ready_reason()

    def shut_down(self, grace_s: float) -> None:
        in_parallel(partial(self.own.shut_down, grace_s), partial(self.upstream.shut_down, grace_s))

    def loads(self) -> list[ModelLoad]:
        return [*self.own.loads(), *self.upstream.loads()]

    def deployment_queues(self) -> list[DeploymentQueue]:
        return self.own.deployment_queues()

    def start(self) -> None:
        self.own.start()
        self.upstream.start()

    def housekeep(self) -> None:
        self.own.housekeep()

    # The model servers' side, for the admin, /metrics and the web server's start-up.
    def endpoint_snapshots(self) -> list[dict[str, Any]]:
        """Each model-server endpoint's state, requests in flight, errors and first token."""
        return self.upstream.pool.snapshots()

    def endpoints_refresh(self) -> None:
        """Read the endpoints' settings again now (the admin saved them), not within seconds."""
        self.upstream.refresh(force=True)

    def serve_on_running_loop(self) -> None:
        self.upstream.serve_on_running_loop()


def in_parallel(*calls: Callable[[], None]) -> None:
    """Run the calls on threads of their own and wait for all (shutdowns that each wait)."""
    threads = [threading.Thread(target=call, name="chatsite-shutdown") for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


_backend_lock = threading.Lock()


def backend() -> ModelRouter:
    """The backend this deployment runs generations on, chosen once per runtime:
    GENERATION_BACKEND picks its own (in-process or Celery); the upstream endpoints serve
    their models."""
    current = runtime.current()
    with _backend_lock:
        if current.backend is None:
            own = CeleryBackend() if settings.GENERATION_BACKEND == "celery" else InProcessBackend()
            current.backend = ModelRouter(own, UpstreamBackend())
        assert isinstance(current.backend, ModelRouter)
        return current.backend


def _housekeep_inline() -> None:
    """Run Celery beat's schedule in this process, for the in-process backend.

    Without workers there is no beat process: the one web process settles the answers
    of a predecessor that died (at once, and again as heartbeats lapse), rolls usage up
    and expires streams, on beat's schedule, calling the same tasks by name.
    """
    current_app.loader.import_default_modules()
    entries: list[dict[str, Any]] = list(settings.CELERY_BEAT_SCHEDULE.values())
    schedule = {entry["task"]: float(entry["schedule"]) for entry in entries}
    due = dict.fromkeys(schedule, 0.0)
    while True:
        for task, period_s in schedule.items():
            if time.monotonic() >= due[task]:
                due[task] = time.monotonic() + period_s
                try:
                    current_app.tasks[task]()
                except Exception:
                    logger.exception("Housekeeping task %s failed", task)
                finally:
                    close_old_connections()
        time.sleep(max(0.0, min(due.values()) - time.monotonic()))
