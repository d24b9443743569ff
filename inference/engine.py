"""The engine: a bounded queue of generation jobs in front of one loaded model.

Two schedulers run the jobs. `batched` (the default) decodes up to `max_concurrent`
generations together, one forward pass per step for all of them (inference/batching.py);
`sequential` runs each job's own `generate()` call on up to `max_concurrent` threads.
Either way each job publishes to the stream store: `status` events while it waits for
room, `token` events, then exactly one `done` or `error`. The job's callbacks save the
result (the producer saves, not the reader) before the terminal event is published, so a
reader that sees `done` finds the saved message. No Django imports here.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from inference.batching import Batch, Sequence, forget_compiled_steps, open_batch, wants_static
from inference.fair_queue import FairQueue
from inference.generators import ChatTokenizer, GenerationOutcome, GenerationParams, Generator, Prompt, UnfitPrompt
from inference.residency import (
    ModelBudget,
    ModelNotLoaded,
    Residency,
    ResidencyOrders,
    ResidentModel,
    free_memory,
)
from inference.streams import PRODUCER_BEAT_S, PRODUCER_BEAT_TTL_S, GenerationStatus, StreamStore, interrupted_event

logger = logging.getLogger(__name__)

T = TypeVar("T")

# A stream event to publish: (stream id, type, data).
Event = tuple[str, str, dict[str, Any]]


@dataclass(frozen=True)
class GenerationResult:
    text: str
    status: GenerationStatus  # not STREAMING: a result is final
    finish_reason: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Of the prompt's tokens, those the model did not run again (its prefix cache).
    cached_tokens: int = 0
    ttft_s: float | None = None
    duration_s: float = 0.0
    error: str = ""
    # The token counts are estimates: the model server that generated it reported none.
    usage_estimated: bool = False
    # Why it failed, in the API's words (e.g. "upstream_timeout"); None: the generic code.
    error_code: str | None = None
    # From submission until a batch row (or a model server's slot) took it; None: never taken.
    queue_wait_s: float | None = None
    # Tool calls run for it (a model server's answer with tools, inference/tool_loop.py).
    tool_calls: int = 0

    @property
    def ttft_ms(self) -> int | None:
        return None if self.ttft_s is None else round(self.ttft_s * 1000)

    @property
    def duration_ms(self) -> int:
        return round(self.duration_s * 1000)

    def outcome_fields(self) -> dict[str, Any]:
        """What the answer and the usage record both save of a finished generation."""
        return {
            "status": self.status,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft_ms": self.ttft_ms,
            "duration_ms": self.duration_ms,
        }

    def summary(self) -> dict[str, Any]:
        """The `done` event's data."""
        decode_s = self.duration_s - (self.ttft_s or 0.0)
        usage: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }
        if self.cached_tokens:  # as OpenAI's API says it
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return {
            "status": self.status,
            "finish_reason": self.finish_reason,
            "usage": usage,
            "timings": {
                "ttft_ms": None if self.ttft_s is None else round(self.ttft_s * 1000, 1),
                "duration_ms": round(self.duration_s * 1000, 1),
                "tokens_per_s": round((self.completion_tokens - 1) / decode_s, 2)
                if self.completion_tokens > 1 and decode_s > 0
                else None,
            },
        }


@dataclass
class Job:
    stream_id: str
    prompt: Prompt
    params: GenerationParams = field(default_factory=GenerationParams)
    # Called from the engine thread with the text so far, at most every
    # `progress_interval_s`, and with the final result.
    on_progress: Callable[[str], None] | None = None
    on_finish: Callable[[GenerationResult], None] | None = None
    submitted_at: float = field(default_factory=time.monotonic)
    # Generations ahead of it in the queue, as last told to its readers (None: never waited).
    ahead: int | None = None
    # Its place in the waiting order (inference/fair_queue.py): its plan's priority (higher
    # goes first) and whose it is (a user's jobs take turns with other users').
    priority: int = 0
    owner: str = ""
    # Rewrites the answer's text before it is published (guardrails' answer rules): every
    # reader, the saved answer and the response cache get only what it let through.
    text_filter: TextFilter | None = None


class TextFilter(Protocol):
    """What may be shown now of an answer's text as it streams: `feed` each piece, `flush`
    the rest at the end. Once `blocked`, the answer ends (finish reason content_filter)."""

    blocked: bool

    def feed(self, text: str) -> str: ...
    def flush(self) -> str: ...


# The finish reason of an answer a TextFilter ended (OpenAI's).
CONTENT_FILTER = "content_filter"


class StopMatcher:
    """Cuts the text at the first stop sequence, holding back what may be the start of one."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.matched = False
        self._held = ""

    def feed(self, text: str) -> str:
        """The part of the text seen so far that is safe to show now."""
        if not self.stops:
            return text
        self._held += text
        found = [i for i in (self._held.find(s) for s in self.stops) if i >= 0]
        if found:
            self.matched = True
            safe, self._held = self._held[: min(found)], ""
            return safe
        keep = max((_overlap(self._held, s) for s in self.stops), default=0)
        safe, self._held = self._held[: len(self._held) - keep], self._held[len(self._held) - keep :]
        return safe

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


def _overlap(text: str, stop: str) -> int:
    """Length of the longest end of `text` that is a beginning of `stop`."""
    for size in range(min(len(text), len(stop) - 1), 0, -1):
        if stop.startswith(text[-size:]):
            return size
    return 0


class BackgroundLoad(Generic[T]):
    """Something slow to load (a model, a tokenizer), loaded once on a thread of its own:
    `value` once it loaded, `error` once it failed, `wait()` until either.

    The engine loads its model this way and the Celery dispatcher its tokenizer, so that a
    web process answers its probes (not ready yet) while it loads."""

    def __init__(self, load: Callable[[], T], *, what: str) -> None:
        self._load = load
        self._what = what
        self.value: T | None = None
        self.error: str | None = None
        self._done = threading.Event()  # set once loading ended, well or not

    def thread(self) -> threading.Thread:
        """The (unstarted) thread that loads it."""
        return threading.Thread(target=self._run, name=f"chatsite-load-{self._what}", daemon=True)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until loading ended; whether it did within `timeout`."""
        return self._done.wait(timeout)

    def _run(self) -> None:
        try:
            self.value = self._load()
        except Exception as error:
            logger.exception("The %s failed to load", self._what)
            self.error = f"{type(error).__name__}: {error}"
        self._done.set()


class EngineOverloaded(RuntimeError):
    pass


def failure_message(reference: str) -> str:
    """What a client is told of a failure inside the server, for every channel.

    Never the exception's text, which can carry paths, tensor shapes or device details:
    the log has it, with the traceback, under `reference` (a stream or request id).
    """
    return f"The server had an error while processing your request. Reference: {reference}."


SCHEDULERS = ("batched", "sequential")
# For tests, as Celery's task_always_eager: each job runs to its end inside submit(), in
# the caller's thread, and its saves with it (not a setting: a server never runs so).
EAGER = "eager"

# Seconds before a model kept warm whose load failed is loaded again.
WARM_RETRY_S = 30.0

# An answer the server's shutdown cut short (Engine.shut_down; the reaper's, for a dead process).
INTERRUPTED = "The server stopped while this answer was being written."


class _Run:
    """One job's generation under way: publishes its text as it comes and builds its result."""

    def __init__(self, job: Job, engine: Engine, outbox: list[Event] | None = None) -> None:
        self.job = job
        self.store = engine.store
        # Where its token events go: straight to the store, or (batched) into the step's
        # outbox, published for all rows at once after the step.
        self.outbox = outbox
        self.progress_interval_s = engine.progress_interval_s
        self._finisher = engine._finisher
        self.pieces: list[str] = []
        self.first_token_at: float | None = None
        self.last_progress = self.taken_at = time.monotonic()
        self.stop = StopMatcher(job.params.stop)
        self.cancelled = False  # set by whoever watches the store's cancel flag
        self._shutting_down = engine._interrupting
        self.sequence = Sequence(job.prompt, job.params, self.on_token, self.should_stop, job.owner)

    def on_token(self, text: str) -> None:
        if not self.stop.matched and not self.filtered():
            self._publish(self._filter(self.stop.feed(text)))

    def _filter(self, text: str) -> str:
        return text if self.job.text_filter is None else self.job.text_filter.feed(text)

    def filtered(self) -> bool:
        """Whether its text filter ended the answer."""
        return self.job.text_filter is not None and self.job.text_filter.blocked

    def should_stop(self) -> bool:
        return self.stop.matched or self.filtered() or self.cancelled or self._shutting_down.is_set()

    def poll_cancelled(self) -> bool:
        """should_stop(), asking the store first: one round trip per call."""
        self.cancelled = self.cancelled or self.store.is_cancelled(self.job.stream_id)
        return self.should_stop()

    def _publish(self, text: str) -> None:
        if not text:
            return
        now = time.monotonic()
        if self.first_token_at is None:
            self.first_token_at = now
        self.pieces.append(text)
        if self.outbox is None:
            self.store.append(self.job.stream_id, "token", {"delta": text})
        else:
            self.outbox.append((self.job.stream_id, "token", {"delta": text}))
        if self.job.on_progress and now - self.last_progress >= self.progress_interval_s:
            self.last_progress = now
            self._finisher.submit(_call_safely, self.job.on_progress, "".join(self.pieces))

    def finished(self, outcome: GenerationOutcome) -> GenerationResult:
        self._publish(self._filter(self.stop.flush()))
        if self.job.text_filter is not None:
            self._publish(self.job.text_filter.flush())
        finish_reason = "stop" if self.stop.matched else outcome.finish_reason
        finish_reason = CONTENT_FILTER if self.filtered() else finish_reason
        if finish_reason == "cancelled" and self._interrupted():
            return self._result(
                status=GenerationStatus.INTERRUPTED,
                finish_reason="error",
                error=INTERRUPTED,
                prompt_tokens=outcome.prompt_tokens,
                completion_tokens=outcome.completion_tokens,
                cached_tokens=outcome.cached_tokens,
            )
        return self._result(
            status=GenerationStatus.STOPPED if finish_reason == "cancelled" else GenerationStatus.COMPLETE,
            finish_reason=finish_reason,
            prompt_tokens=outcome.prompt_tokens,
            completion_tokens=outcome.completion_tokens,
            cached_tokens=outcome.cached_tokens,
        )

    def cancelled_before_start(self) -> GenerationResult:
        if self._interrupted():
            return self._result(status=GenerationStatus.INTERRUPTED, finish_reason="error", error=INTERRUPTED)
        return self._result(status=GenerationStatus.STOPPED, finish_reason="cancelled")

    def _interrupted(self) -> bool:
        """Stopped by the server's shutdown, not by its reader."""
        return self._shutting_down.is_set() and not self.cancelled and not self.stop.matched

    def failed(self, error: Exception) -> GenerationResult:
        if isinstance(error, UnfitPrompt):
            return self._result(status=GenerationStatus.ERROR, finish_reason="error", error=str(error))
        logger.error("Generation %s failed", self.job.stream_id, exc_info=error)
        return self._result(
            status=GenerationStatus.ERROR, finish_reason="error", error=failure_message(self.job.stream_id)
        )

    def _result(self, **kwargs: Any) -> GenerationResult:
        # Timed from submission: time spent waiting in the queue is part of what users wait.
        started = self.job.submitted_at
        return GenerationResult(
            text="".join(self.pieces),
            ttft_s=None if self.first_token_at is None else self.first_token_at - started,
            duration_s=time.monotonic() - started,
            queue_wait_s=self.taken_at - started,
            **kwargs,
        )


class Engine:
    """Runs jobs, up to `max_concurrent` at once, on one loaded generator.

    Beyond that, up to `max_queue` jobs wait, taken by priority, then in turns across
    owners, then in arrival order (FairQueue); each is told how many are ahead of it, and
    told again when that changes. While it runs the engine beats as `producer` in the
    stream store every few seconds, so other processes can tell its unfinished streams
    from those of a dead process.

    With `idle_unload_s` (CHAT_MODEL_IDLE_UNLOAD_S), the model leaves memory after that
    long with nothing running or waiting (inference/residency.py); the next job loads it
    again, its readers told first (a `loading` status), the jobs that come meanwhile
    waiting for that one load.

    `orders` (read every `orders_every_s` seconds, on the same thread) carries what operators
    say of the model in every process at once (the admin's "unload now" and "keep warm", a
    plan's pin): unload it as soon as nothing runs or waits; keep it in memory, loading it
    now where it is out. `budget` (CHAT_MAX_LOADED_MODELS) bounds the models this process
    holds: before this one loads, the least recently used idle one leaves.
    """

    def __init__(
        self,
        load: Callable[[], Generator],
        store: StreamStore,
        *,
        scheduler: str = "batched",
        max_queue: int = 64,
        max_concurrent: int = 1,
        producer: str = "engine",
        progress_interval_s: float = 2.0,
        cuda_graphs: str = "0",
        slot_tokens: int = 4096,
        compiled: bool = False,
        prefix_cache_mb: int = 0,
        threads: int | None = None,
        idle_unload_s: float = 0.0,
        on_loaded: Callable[[float], None] | None = None,
        orders: Callable[[], ResidencyOrders] | None = None,
        orders_every_s: float = 5.0,
        budget: ModelBudget | None = None,
    ) -> None:
        if scheduler not in (*SCHEDULERS, EAGER):
            raise ValueError(f"scheduler must be one of {SCHEDULERS}, not {scheduler!r}")
        self._load = load
        self._model = ResidentModel(self._load_within_budget, on_loaded=on_loaded, on_reload_failed=self._fail_waiting)
        self.idle_unload_s = idle_unload_s  # 0: the model stays loaded
        self._batch: Batch | None = None  # the batched scheduler's, opened after each load
        self._broken: str | None = None  # why the decoding thread died, if it did: nothing runs
        # Set once the batched scheduler opened what it opens at start-up (_open_batch_now).
        self._prepared = threading.Event()
        self._busy_at = time.monotonic()  # when the last job ended
        self._used_at = self._busy_at  # when the last job came or ended (the budget's LRU order)
        self._orders = orders
        self.orders_every_s = orders_every_s
        self._unloads_seen: int | None = None  # orders.unloads when last read; None: never read
        self._keep_warm = False
        self._unload_asked = False  # "unload now": as soon as nothing runs or waits
        self.budget = budget  # CHAT_MAX_LOADED_MODELS, shared with the process's other engines
        if budget is not None:
            budget.join(self)
        self.store = store
        self.scheduler = scheduler
        if scheduler != "batched":
            self._prepared.set()  # nothing opens at start-up
        self.max_queue = max_queue
        self.max_concurrent = max_concurrent
        self.producer = producer
        self.progress_interval_s = progress_interval_s
        self.cuda_graphs = cuda_graphs  # GENERATION_CUDA_GRAPHS: how the batch decodes
        self.slot_tokens = slot_tokens
        self.prefix_cache_mb = prefix_cache_mb  # GENERATION_PREFIX_CACHE_MB: finished sequences' keys and values kept
        self.compiled = compiled  # GENERATION_COMPILE: the static step compiled where no graph runs it
        self.threads = threads  # GENERATION_THREADS: a CPU model's threads; None: torch's own (a core each)
        self.active = 0
        self.generated_tokens = 0
        self._jobs: FairQueue[Job] = FairQueue()
        self._lock = threading.Lock()
        self._job_ready = threading.Condition(self._lock)
        # Sequential workers waiting for a job that no submitted job has been promised to yet.
        self._free = 0
        self._stopping = threading.Event()  # no new jobs; the threads end once none is left
        self._wake = threading.Event()  # the residency thread looks again now
        self._interrupting = threading.Event()  # the jobs left end now, as interrupted
        self._threads: list[threading.Thread] = []
        self._workers: list[threading.Thread] = []
        # Saves and terminal events go out in order on their own thread, so that a slow
        # database never holds up the decoding step of every generation in the batch.
        self._finisher: Executor = (
            _InTheCallersThread()
            if scheduler == EAGER
            else ThreadPoolExecutor(max_workers=1, thread_name_prefix="chatsite-finish")
        )

    @property
    def generator(self) -> Generator | None:
        """The model, while it is in memory."""
        return self._model.generator

    @property
    def tokenizer(self) -> ChatTokenizer | Generator | None:
        """What counts prompt tokens: the model, or its tokenizer while the model is out of memory."""
        return self._model.tokenizer

    @property
    def load_error(self) -> str | None:
        return self._broken or self._model.error

    @property
    def residency(self) -> Residency:
        return self._model.state

    @property
    def loaded(self) -> bool:
        return self._model.state == Residency.LOADED

    @property
    def ready(self) -> bool:
        """It serves: its model loaded, or unloaded while idle and loaded again on demand."""
        if not self._prepared.is_set() or self._broken is not None:
            return False
        return self._model.ready and not self._stopping.is_set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def holds_memory(self) -> bool:
        """Its model is in memory or on its way there (for the budget)."""
        return self._model.state in (Residency.LOADING, Residency.LOADED, Residency.RELOADING)

    @property
    def keep_warm(self) -> bool:
        """Kept in memory: never unloaded while idle, nor to make room for another model."""
        return self._keep_warm

    @property
    def last_used(self) -> float:
        return max(self._used_at, self._model.loaded_at)

    @property
    def unload_pending(self) -> bool:
        """ "Unload now" was asked while generations ran or waited: it unloads once they end."""
        return self._unload_asked and self._model.state == Residency.LOADED

    def set_keep_warm(self, keep: bool) -> None:
        """Keep the model in memory (loaded again now where it was out), or stop keeping it."""
        with self._lock:
            self._keep_warm = keep
            if keep:
                self._unload_asked = False
        self._wake.set()

    def unload_now(self, *, unloads_seen: int | None = None) -> bool:
        """Free the model as soon as nothing runs or waits: now, where nothing does (whether
        it did). A running generation is never cut short; one that comes meanwhile loads
        the model again. Not while kept warm.

        `unloads_seen`: the orders' count of "unload now" that this call carries out, so
        that reading the orders later does not unload a second time."""
        with self._lock:
            if unloads_seen is not None:
                self._unloads_seen = max(self._unloads_seen or 0, unloads_seen)
            if self._keep_warm or self._model.state != Residency.LOADED:
                return False  # kept warm, or not in memory: nothing to unload
            self._unload_asked = True
        if self.unload_if_idle():
            return True
        if self._unloaded_as_asked():  # by the residency thread, which saw the order first
            return True
        self._wake.set()  # the residency thread unloads it once the last generation ends
        return False

    def _unloaded_as_asked(self) -> bool:
        with self._lock:
            return self._model.state == Residency.UNLOADED and not self._unload_asked

    def unload_if_idle(self) -> bool:
        """Free the model now unless something runs or waits (or it is out already)."""
        with self._lock:
            if self.active or self._jobs or self._model.state != Residency.LOADED:
                return False
        return self._unload(forced=True)

    @property
    def queued(self) -> int:
        """Jobs waiting for room (not yet generating)."""
        with self._lock:
            return len(self._jobs)

    def wait_ready(self, timeout: float | None = None) -> bool:
        started = time.monotonic()
        if self._model.wait_first_load(timeout):
            self._prepared.wait(None if timeout is None else max(0.0, started + timeout - time.monotonic()))
        return self.ready

    def start(self) -> None:
        """Load the generator in the background (once), and beat from now on."""
        with self._lock:
            if not self._threads:
                self._threads = [
                    self._model.thread(),
                    threading.Thread(target=self._beat, name="chatsite-heartbeat", daemon=True),
                ]
                if self.scheduler != EAGER:
                    self._threads.append(
                        threading.Thread(target=self._mind_residency, name="chatsite-residency", daemon=True)
                    )
                if self.scheduler == "batched":
                    self._threads.append(threading.Thread(target=self._batch_loop, name="chatsite-batch", daemon=True))
                for thread in self._threads:
                    thread.start()

    def submit(self, job: Job) -> None:
        """Queue a job; refuse it at once when `max_queue` jobs already wait for room.

        A job that has to wait is told how many are ahead of it (a `status` event); the
        waiting jobs it goes ahead of (a user's first among another's many) are told their
        new places."""
        with self._lock:
            if self._stopping.is_set():
                raise EngineOverloaded("the server is shutting down")
            if self._broken:
                raise EngineOverloaded(f"the model can't serve ({self._broken})")
            waiting = self.active + len(self._jobs) - self.max_concurrent
            if waiting >= self.max_queue:
                raise EngineOverloaded(f"{waiting} generations are already waiting")
            self.store.create(job.stream_id)
            self._jobs.append(job)
            self._used_at = time.monotonic()
            index = self._jobs.index(job)
            ahead = self.active + index - self.max_concurrent
            try:
                # Freed while idle: its readers hear first that the model loads again.
                if self._model.state in (Residency.UNLOADED, Residency.RELOADING):
                    self.store.append(job.stream_id, "status", {"state": "loading"})
                # Told unless its readers already know this place (a job queued by a web process
                # of GENERATION_BACKEND=celery comes with the place it was told there).
                if ahead >= 0 and ahead != job.ahead:
                    self.store.append(job.stream_id, "status", {"state": "queued", "ahead": ahead})
                    job.ahead = ahead
            except Exception:
                self._jobs.remove(job)  # refused: it must not run, nor hold a place
                raise
            news = self._pushed_back(index)
            if self.scheduler == "batched":
                self._job_ready.notify()
            elif self._free > 0:
                self._free -= 1  # promised to one waiting worker, woken here
                self._job_ready.notify()
            elif self.scheduler == EAGER:
                pass  # run below, once the lock is released
            elif len(self._workers) < self.max_concurrent:
                worker = threading.Thread(target=self._work, name=f"chatsite-worker-{len(self._workers)}", daemon=True)
                self._workers.append(worker)
                worker.start()
        self._publish_status(news)
        self.start()
        if self.scheduler == EAGER:
            self._model.wait_first_load()
            for taken in self._take(1, wait=False) or []:
                self._generate_alone(taken)

    def cancel(self, stream_id: str) -> bool:
        return self.store.cancel(stream_id)

    def stop(self, timeout: float | None = None) -> None:
        """Finish the running and waiting jobs, then end the threads."""
        self._stopping.set()
        self._wake.set()
        with self._lock:
            self._job_ready.notify_all()
        for thread in [*self._workers, *self._threads]:
            thread.join(timeout)
        self._finisher.shutdown(wait=True)

    def shut_down(self, grace_s: float) -> None:
        """Refuse new jobs; let the running and waiting ones finish for up to `grace_s`
        seconds; end the rest as interrupted, their text kept (within a decoding step);
        then end the threads, once every result is saved."""
        self._stopping.set()
        self._wake.set()
        with self._lock:
            self._job_ready.notify_all()
        deadline = time.monotonic() + grace_s
        while self.busy() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._interrupting.set()
        self.stop()

    def busy(self) -> bool:
        with self._lock:
            return self.active > 0 or bool(self._jobs)

    def _unload_due_in(self) -> float | None:
        """Seconds until the model is to leave memory, if nothing runs or waits meanwhile;
        None while it is not in memory or never leaves it. Called with the lock held."""
        if self._model.state != Residency.LOADED or self._keep_warm:
            return None
        if not (self.idle_unload_s or self._unload_asked):
            return None
        if self.active or self._jobs:
            return self.idle_unload_s or None  # idle unload: at the soonest, look again then
        if self._unload_asked:
            return 0.0
        idle_since = max(self._busy_at, self._model.loaded_at)
        return max(0.0, idle_since + self.idle_unload_s - time.monotonic())

    def _mind_residency(self) -> None:
        """The residency thread: reads the operators' orders, unloads the model when it is
        due, loads it again while kept warm. Woken early by a job's end and by new orders."""
        self._model.wait_first_load()
        while not self._stopping.is_set():
            self._wake.clear()  # before looking: a wake from here on is not missed
            self._read_orders()
            if self._keep_warm and self._model.state == Residency.UNLOADED and not self._load_again():
                self._stopping.wait(WARM_RETRY_S)  # not in a tight loop of failing loads
                continue
            with self._lock:
                due = self._unload_due_in()
            if due == 0:
                self._unload()
                continue
            waits = [w for w in (due, self.orders_every_s if self._orders else None) if w is not None]
            self._wake.wait(min(waits) if waits else None)

    def _read_orders(self) -> None:
        """Apply the operators' orders, where there are any; a failed read keeps the last ones."""
        if self._orders is None:
            return
        try:
            orders = self._orders()
        except Exception:
            logger.exception("Could not read the model's residency orders; keeping the last ones")
            return
        self._take_orders(orders)

    def apply_orders(self, orders: ResidencyOrders) -> None:
        """Take these orders now (read elsewhere), not at the next read."""
        self._take_orders(orders)
        self._wake.set()

    def _take_orders(self, orders: ResidencyOrders) -> None:
        """Keep warm as the orders say; unload as soon as idle if "unload now" was asked
        since the last orders this engine saw (the first it sees only set the count: an
        unload asked before this process started was done by those that ran then)."""
        with self._lock:
            self._keep_warm = orders.keep_warm
            asked = self._unloads_seen is not None and orders.unloads > self._unloads_seen
            self._unloads_seen = max(self._unloads_seen or 0, orders.unloads)
            # Only a model in memory has something to unload: an order must not outlive it.
            in_memory = self._model.state == Residency.LOADED
            self._unload_asked = (self._unload_asked or asked) and in_memory and not orders.keep_warm

    def _load_again(self) -> bool:
        """Load the freed model now (kept warm): the next generation finds it in memory.
        Whether it loaded (a failure is logged where the load failed)."""
        try:
            self._model.acquire()
        except ModelNotLoaded:
            return False
        return True

    def _load_within_budget(self) -> Generator:
        if self.budget is not None:
            self.budget.make_room(self)
        return self._load()

    def _unload(self, *, forced: bool = False) -> bool:
        """Free the model (and the batch's caches and CUDA graphs) unless a job came meanwhile;
        whether it did. `forced`: now, idle time or not (unload now, room for another model).

        Decided under the lock, so that a job submitted from here on is told it loads
        again. Nothing else holds the model now: jobs use it only while counted active."""
        with self._lock:
            if self.active or self._jobs or self._model.state != Residency.LOADED:
                return False
            if not forced and self._unload_due_in() != 0:
                return False
            why = "as asked" if self._unload_asked else "to make room" if forced else "while idle"
            self._unload_asked = False
            batch, self._batch = self._batch, None
            generator = self._model.release()
        del batch, generator  # the last references: their tensors go now
        if self.compiled:
            forget_compiled_steps()  # what torch.compile keeps holds the frozen weights
        free_memory()
        logger.info("The model left memory (%s)", why)
        return True

    def _fail_waiting(self, error: str) -> None:
        """End the jobs waiting for a reload that failed, with its error: told that the
        model loads, they must not wait for the next try."""
        with self._lock:
            failed = [self._jobs.popleft() for _ in range(len(self._jobs))]
            self.active += len(failed)  # never ran, but _end() counts them out like the others
        for job in failed:
            run = _Run(job, self)
            self._finish(run, run.failed(ModelNotLoaded(f"the model is not loaded ({error})")))

    def _beat(self) -> None:
        while True:
            try:
                self.store.beat(self.producer, ttl_s=PRODUCER_BEAT_TTL_S)
            except Exception:
                logger.exception("Engine heartbeat failed")
            if self._stopping.wait(PRODUCER_BEAT_S):
                return

    def _take(self, count: int, *, wait: bool, decoding: int | None = None) -> list[Job] | None:
        """Up to `count` of the jobs first in order, counted as active from now on. With
        `wait`, blocks until there is one; None once the engine stops and no job is left.

        `decoding`: the rows the batch runs now. The waiting jobs' places count from it,
        not from `active`, which still counts the rows that left the batch until their
        saves are done: a place must not lag behind a slow database."""
        with self._lock:
            while wait and not self._jobs:
                if self._stopping.is_set():
                    return None
                if self.scheduler == "sequential":
                    self._free += 1  # submit() takes us off _free when it wakes us
                self._job_ready.wait()
            taken = [self._jobs.popleft() for _ in range(min(count, len(self._jobs)))]
            self.active += len(taken)
            news = [(job.stream_id, {"state": "running"}) for job in taken if job.ahead is not None]
            news += self._places_changed(self.active if decoding is None else decoding + len(taken))
        self._publish_status(news)
        return taken

    def _cancelled_among(self, stream_ids: list[str]) -> set[str]:
        """Which of these streams, and of the waiting jobs', were cancelled.

        Asked once per step for every row, joining and waiting job together: one store
        call (one Redis round trip), not one per row. A look that fails finds none; the
        next step looks again, and a store that stays down stops the rows in `_send`."""
        with self._lock:
            waiting = [job.stream_id for job in self._jobs]
        try:
            return self.store.cancelled_among([*stream_ids, *waiting])
        except Exception:
            logger.exception("Could not read the cancel flags; looking again at the next step")
            return set()

    def _withdraw_cancelled(self, stream_ids: set[str]) -> None:
        """End the waiting jobs among these at once, without waiting for their turn."""
        with self._lock:
            gone = [job for job in self._jobs if job.stream_id in stream_ids]
            for job in gone:
                self._jobs.remove(job)
            news = self._places_changed(self.active)
            self.active += len(gone)  # never ran, but _end() counts them out like the others
        self._publish_status(news)
        for job in gone:
            run = _Run(job, self)
            run.cancelled = True
            self._finish(run, run.cancelled_before_start())

    def _places_changed(self, occupied: int) -> list[tuple[str, dict[str, Any]]]:
        """Status news for the waiting jobs whose place changed, `occupied` rows being taken;
        called with the lock held."""
        news: list[tuple[str, dict[str, Any]]] = []
        for index, job in enumerate(self._jobs):
            ahead = max(occupied + index - self.max_concurrent, 0)
            if job.ahead is not None and ahead != job.ahead:
                job.ahead = ahead
                news.append((job.stream_id, {"state": "queued", "ahead": ahead}))
        return news

    def _pushed_back(self, index: int) -> list[tuple[str, dict[str, Any]]]:
        """Status news for the waiting jobs behind a job that joined the queue at `index`:
        each is one place further back (the queue reorders nothing else); called with the
        lock held.

        Counted from the place told where there is one: counted from `active`, the place
        can only be too high (active still counts the rows whose saves are under way, see
        _take), so it bounds the place told, which a Celery web process may have set."""
        news: list[tuple[str, dict[str, Any]]] = []
        for position, job in enumerate(itertools.islice(self._jobs, index + 1, None), start=index + 1):
            at_most = self.active + position - self.max_concurrent
            if job.ahead is None:
                if at_most < 0:
                    continue  # a row is still free for it
                ahead = at_most  # it had a free row until now: it waits from here on
            else:
                ahead = min(job.ahead + 1, max(at_most, 0))
            if ahead != job.ahead:
                job.ahead = ahead
                news.append((job.stream_id, {"state": "queued", "ahead": ahead}))
        return news

    def _publish_status(self, news: list[tuple[str, dict[str, Any]]]) -> None:
        for stream_id, data in news:
            self._append_quietly(stream_id, "status", data)

    def _work(self) -> None:
        """A sequential worker: one generate() call at a time."""
        self._use_threads()
        self._model.wait_first_load()
        while jobs := self._take(1, wait=True):
            self._generate_alone(jobs[0])

    def _use_threads(self) -> None:
        """The calling thread's torch operators split over `threads` threads (torch keeps
        the setting per thread: the embedder's and other engines' are their own)."""
        if self.threads is not None:
            import torch

            torch.get_num_threads()  # torch sets a thread up on its first call: not after ours
            torch.set_num_threads(self.threads)

    def _generate_alone(self, job: Job) -> None:
        """One job's own generate() call, then its result saved and its terminal event."""
        run = _Run(job, self)
        self._finish(run, self._outcome_alone(run)).result()

    def _outcome_alone(self, run: _Run) -> GenerationResult:
        # A frame of its own: its hold on the model ends before the job counts as ended.
        try:
            if run.poll_cancelled():  # cancelled while waiting in the queue
                return run.cancelled_before_start()
            generator = self._model.acquire()  # loaded first where it was freed
            return run.finished(generator.generate(run.job.prompt, run.job.params, run.on_token, run.poll_cancelled))
        except Exception as error:
            return run.failed(error)

    def _open_batch(self) -> Batch:
        """The batch of the model, opened once per load, the model loaded first where it was freed."""
        if self._batch is not None:
            return self._batch
        generator = self._model.acquire()
        if self._model.error:  # its batch could not be set up after this load
            raise ModelNotLoaded(f"the model is not loaded ({self._model.error})")
        try:
            batch = open_batch(
                generator,
                max_rows=self.max_concurrent,
                cuda_graphs=self.cuda_graphs,
                row_tokens=self.slot_tokens,
                compiled=self.compiled,
                prefix_cache_bytes=self.prefix_cache_mb * 2**20,
            )
        except Exception as error:  # e.g. no memory for the key/value slots: every job is told why
            logger.exception("The batch could not be set up")
            self._model.error = f"{type(error).__name__}: {error}"  # setting up the batch is part of loading
            raise ModelNotLoaded(f"the model is not loaded ({self._model.error})") from error
        # Static slots sized down to the memory free: no more rows than they hold run at once.
        self.max_concurrent = min(self.max_concurrent, getattr(batch, "capacity", self.max_concurrent))
        self._batch = batch
        return batch

    def _open_batch_now(self) -> None:
        """On the static path, open the batch as soon as the model has loaded, before any
        job is taken: its slots are sized (and `max_concurrent` lowered to what they hold)
        and its graphs captured (or its step compiled) at start-up, not in a request, and
        the engine says it is ready once that is done. Counted as active meanwhile, so
        that the model can't be unloaded under it."""
        with self._lock:
            generator = self._model.generator
            if self._model.state != Residency.LOADED or not wants_static(generator, self.cuda_graphs):
                return  # the dynamic path's batch costs nothing to open with the first job
            self.active += 1
        try:
            self._open_batch()
        except ModelNotLoaded:
            pass  # logged; each job is told at its turn
        finally:
            with self._lock:
                self.active -= 1

    def _batch_loop(self) -> None:
        """The batched scheduler: one thread stepping every running generation together."""
        self._use_threads()
        self._model.wait_first_load()
        try:
            self._open_batch_now()
        finally:
            self._prepared.set()  # ready from now on: /readyz waited for the compiling
        runs: dict[Sequence, _Run] = {}
        outbox: list[Event] = []
        try:
            while (jobs := self._take(self.max_concurrent - len(runs), wait=not runs, decoding=len(runs))) is not None:
                self._batch_step(jobs, runs, outbox)
        except BaseException as error:  # a failure outside any step's own handling
            self._die(error, runs)

    def _die(self, error: BaseException, runs: dict[Sequence, _Run]) -> None:
        """The decoding thread can't go on: every generation running or waiting ends with
        an error, new ones are refused, and the engine is no longer ready (/readyz says
        why), rather than a live-looking engine whose jobs hang."""
        logger.critical("The batched decoding thread failed; this model serves nothing more", exc_info=error)
        with self._lock:
            self._broken = f"the decoding thread stopped: {type(error).__name__}"
        for run in runs.values():
            self._finish(run, run.failed(error if isinstance(error, Exception) else RuntimeError(self._broken)))
        runs.clear()
        self._fail_waiting(self._broken)

    def _batch_step(self, jobs: list[Job], runs: dict[Sequence, _Run], outbox: list[Event]) -> None:
        """The jobs taken join the batch, then every row decodes a token. A frame of its
        own: while the loop waits for jobs it holds nothing of the model, which may leave."""
        running = {run.job.stream_id: run for run in runs.values()}
        joining = {job.stream_id for job in jobs}
        cancelled = self._cancelled_among([*running, *joining])
        for stream_id in cancelled & running.keys():
            running[stream_id].cancelled = True
        if cancelled - running.keys() - joining:
            self._withdraw_cancelled(cancelled)
        batch: Batch | None = None
        unavailable: Exception | None = None
        if jobs:  # one load (or one failure) for all the jobs joining
            try:
                batch = self._open_batch()
            except Exception as error:
                unavailable = error
        for job in jobs:
            run = _Run(job, self, outbox)
            try:
                if job.stream_id in cancelled or self._interrupting.is_set():
                    run.cancelled = job.stream_id in cancelled
                    self._finish(run, run.cancelled_before_start())
                elif batch is None:
                    self._finish(run, run.failed(unavailable or ModelNotLoaded("the model is not loaded")))
                else:
                    batch.add(run.sequence)
                    runs[run.sequence] = run
            except Exception as error:
                self._finish(run, run.failed(error))
        batch = self._batch
        if not runs or batch is None:
            return
        by_stream = {run.job.stream_id: run for run in runs.values()}
        try:
            finished = batch.step()
        except Exception as error:
            logger.exception("A batched decoding step failed; ending its %d generations", len(runs))
            self._send(outbox, by_stream)  # what they generated before it failed
            batch.cancel_all()
            for run in runs.values():
                self._finish(run, run.failed(error))
            runs.clear()
            return
        finals = []
        for sequence, outcome in finished:
            run = runs.pop(sequence)
            if isinstance(outcome, Exception):  # this row alone failed; the others go on
                finals.append((run, run.failed(outcome)))
            else:
                finals.append((run, run.finished(outcome)))  # may add the text a stop string held back
        # Every row's tokens of this step, before any terminal event that follows them.
        self._send(outbox, by_stream)
        for run, final in finals:
            self._finish(run, final)

    def _send(self, outbox: list[Event], runs: dict[str, _Run]) -> None:
        """Publish a step's token events, all rows in one store call (one Redis round trip).

        A row whose stream refuses its token (gone, or ended from outside) stops at the
        next step, as if cancelled."""
        if not outbox:
            return
        try:
            results: list[int | Exception] = self.store.append_many(outbox)
        except Exception as error:  # e.g. Redis unreachable: stop them all, the engine lives on
            results = [error] * len(outbox)
        for (stream_id, _, _), result in zip(outbox, results, strict=True):
            if isinstance(result, Exception) and stream_id in runs and not runs[stream_id].cancelled:
                logger.warning("Stream %s refused a token (%s); stopping its generation", stream_id, result)
                runs[stream_id].cancelled = True
        outbox.clear()

    def _finish(self, run: _Run, final: GenerationResult) -> Any:
        """Save the result, then publish the terminal event, in order, off the decoding thread."""
        return self._finisher.submit(self._end, run.job, final)

    def _end(self, job: Job, final: GenerationResult) -> None:
        if job.on_finish:
            _call_safely(job.on_finish, final)
        # Counted as finished before readers can see the terminal event, so that
        # whoever reacts to `done` (a test, a dashboard) sees consistent metrics.
        with self._lock:
            self.active -= 1
            self.generated_tokens += final.completion_tokens
            self._busy_at = self._used_at = time.monotonic()
        self._wake.set()  # the residency thread counts the idle time from now
        if final.status == GenerationStatus.INTERRUPTED:  # as the reaper tells a dead process's readers
            self._append_quietly(job.stream_id, *interrupted_event(**final.summary()))
        elif final.status == GenerationStatus.ERROR:
            self._append_quietly(job.stream_id, "error", {"message": final.error, **final.summary()})
        else:
            self._append_quietly(job.stream_id, "done", final.summary())

    def _append_quietly(self, stream_id: str, type: str, data: dict[str, Any]) -> None:
        try:
            self.store.append(stream_id, type, data)
        except Exception:  # e.g. Redis unreachable: the engine must live on
            logger.exception("Could not publish %s to stream %s", type, stream_id)


class _InTheCallersThread(Executor):
    """The eager scheduler's finisher: each save runs as it is handed over."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        done: Future[Any] = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as error:
            done.set_exception(error)
        return done


def _call_safely(callback: Callable[[Any], None], argument: Any) -> None:
    # A failing save must not kill the engine thread or leave the stream open.
    try:
        callback(argument)
    except Exception:
        logger.exception("Generation callback %r failed", callback)
