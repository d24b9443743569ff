"""The engine: a bounded queue of generation jobs and a worker thread that runs them.

The worker loads its generator once, then for each job calls the generator and
publishes what it produces to the stream store: `token` events, then exactly one
`done` or `error`. The job's callbacks save the result (the producer saves, not the
reader) before the terminal event is published, so a reader that sees `done` finds
the saved message. No Django imports here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from generation.generators import ContextLengthExceeded, GenerationParams, Generator, Prompt
from generation.streams import StreamStore

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationResult:
    text: str
    status: str  # "complete" | "stopped" | "error"
    finish_reason: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float | None = None
    duration_s: float = 0.0
    error: str = ""

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
        return {
            "status": self.status,
            "finish_reason": self.finish_reason,
            "usage": {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
            },
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


class EngineOverloaded(RuntimeError):
    pass


class Engine:
    """Runs jobs on up to `max_concurrent` worker threads sharing one loaded generator.

    While it runs it beats as `producer` in the stream store every few seconds, so
    other processes can tell its unfinished streams from those of a dead process.
    """

    HEARTBEAT_S = 5.0

    def __init__(
        self,
        load: Callable[[], Generator],
        store: StreamStore,
        *,
        max_queue: int = 64,
        max_concurrent: int = 1,
        producer: str = "engine",
        progress_interval_s: float = 2.0,
    ) -> None:
        self._load = load
        self.store = store
        self.max_queue = max_queue
        self.max_concurrent = max_concurrent
        self.producer = producer
        self.progress_interval_s = progress_interval_s
        self.generator: Generator | None = None
        self.load_error: str | None = None
        self.active = 0
        self.generated_tokens = 0
        self._jobs: deque[Job] = deque()
        self._lock = threading.Lock()
        self._job_ready = threading.Condition(self._lock)
        # Workers waiting for a job that no submitted job has been promised to yet.
        self._free = 0
        self._loaded = threading.Event()  # set once loading ended, well or not
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._workers: list[threading.Thread] = []

    @property
    def ready(self) -> bool:
        return self.generator is not None

    @property
    def queued(self) -> int:
        with self._lock:
            return len(self._jobs)

    def wait_ready(self, timeout: float | None = None) -> bool:
        self._loaded.wait(timeout)
        return self.ready

    def start(self) -> None:
        """Load the generator in the background (once), and beat from now on."""
        with self._lock:
            if not self._threads:
                self._threads = [
                    threading.Thread(target=self._load_generator, name="chatsite-load", daemon=True),
                    threading.Thread(target=self._beat, name="chatsite-heartbeat", daemon=True),
                ]
                for thread in self._threads:
                    thread.start()

    def submit(self, job: Job) -> None:
        """Start a job on a free (or new) worker, else queue it; refuse it at once
        when all `max_concurrent` workers are busy and `max_queue` jobs already wait."""
        with self._lock:
            if self._free > 0:
                self._free -= 1  # promised to one waiting worker, woken below
                self._job_ready.notify()
            elif len(self._workers) < self.max_concurrent:
                worker = threading.Thread(target=self._work, name=f"chatsite-worker-{len(self._workers)}", daemon=True)
                self._workers.append(worker)
                worker.start()
            elif len(self._jobs) >= self.max_queue:
                raise EngineOverloaded(f"{len(self._jobs)} generations are already waiting")
            self.store.create(job.stream_id)
            self._jobs.append(job)
        self.start()

    def cancel(self, stream_id: str) -> bool:
        return self.store.cancel(stream_id)

    def stop(self, timeout: float | None = None) -> None:
        """Finish the running jobs, then end the threads."""
        self._stopping.set()
        with self._lock:
            self._job_ready.notify_all()
        for thread in [*self._workers, *self._threads]:
            thread.join(timeout)

    def _load_generator(self) -> None:
        try:
            self.generator = self._load()
        except Exception as error:
            logger.exception("Model failed to load")
            self.load_error = f"{type(error).__name__}: {error}"
        self._loaded.set()

    def _beat(self) -> None:
        while True:
            try:
                self.store.beat(self.producer, ttl_s=self.HEARTBEAT_S * 3)
            except Exception:
                logger.exception("Engine heartbeat failed")
            if self._stopping.wait(self.HEARTBEAT_S):
                return

    def _next_job(self) -> Job | None:
        """The oldest waiting job, taken as this worker's; None once the engine stops."""
        with self._lock:
            while not self._jobs:
                if self._stopping.is_set():
                    return None
                self._free += 1
                self._job_ready.wait()  # submit() takes us off _free when it wakes us
            self.active += 1
            return self._jobs.popleft()

    def _work(self) -> None:
        self._loaded.wait()
        while (job := self._next_job()) is not None:
            final = self._run(job)
            # Counted as finished before readers can see the terminal event, so that
            # whoever reacts to `done` (a test, a dashboard) sees consistent metrics.
            with self._lock:
                self.active -= 1
                self.generated_tokens += final.completion_tokens
            try:
                if final.status == "error":
                    self.store.append(job.stream_id, "error", {"message": final.error, **final.summary()})
                else:
                    self.store.append(job.stream_id, "done", final.summary())
            except Exception:  # e.g. Redis unreachable: the worker must live on
                logger.exception("Could not end stream %s", job.stream_id)

    def _run(self, job: Job) -> GenerationResult:
        """Generate, publishing tokens as they come, and save the result; never raises."""
        started = time.monotonic()
        pieces: list[str] = []
        first_token_at: float | None = None
        last_progress = started

        stop = StopMatcher(job.params.stop)

        def publish(text: str) -> None:
            nonlocal first_token_at, last_progress
            if not text:
                return
            now = time.monotonic()
            if first_token_at is None:
                first_token_at = now
            pieces.append(text)
            self.store.append(job.stream_id, "token", {"delta": text})
            if job.on_progress and now - last_progress >= self.progress_interval_s:
                last_progress = now
                _call_safely(job.on_progress, "".join(pieces))

        def on_token(text: str) -> None:
            if not stop.matched:
                publish(stop.feed(text))

        def should_stop() -> bool:
            return stop.matched or self.store.is_cancelled(job.stream_id)

        def result(**kwargs: Any) -> GenerationResult:
            return GenerationResult(
                text="".join(pieces),
                ttft_s=None if first_token_at is None else first_token_at - started,
                duration_s=time.monotonic() - started,
                **kwargs,
            )

        try:
            if self.generator is None:
                raise RuntimeError(f"the model is not loaded ({self.load_error})")
            if should_stop():  # cancelled while waiting in the queue
                outcome_kwargs: dict[str, Any] = {"status": "stopped", "finish_reason": "cancelled"}
            else:
                outcome = self.generator.generate(job.prompt, job.params, on_token, should_stop)
                publish(stop.flush())
                finish_reason = "stop" if stop.matched else outcome.finish_reason
                outcome_kwargs = {
                    "status": "stopped" if finish_reason == "cancelled" else "complete",
                    "finish_reason": finish_reason,
                    "prompt_tokens": outcome.prompt_tokens,
                    "completion_tokens": outcome.completion_tokens,
                }
            final = result(**outcome_kwargs)
        except ContextLengthExceeded as error:
            final = result(status="error", finish_reason="error", error=str(error))
        except Exception as error:
            logger.exception("Generation %s failed", job.stream_id)
            final = result(status="error", finish_reason="error", error=f"Generation failed: {error}")
        if job.on_finish:
            _call_safely(job.on_finish, final)
        return final


def _call_safely(callback: Callable[[Any], None], argument: Any) -> None:
    # A failing save must not kill the engine thread or leave the stream open.
    try:
        callback(argument)
    except Exception:
        logger.exception("Generation callback %r failed", callback)
