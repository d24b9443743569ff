"""The process's stream store and engines, built from settings on first use."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from functools import partial
from typing import TYPE_CHECKING, Any

from django.conf import settings

from generation.engine import Engine
from generation.generators import load_chat_tokenizer, load_generator
from generation.jobs import GenerationTask, job_for
from generation.registry import ModelSpec, available_models, resolve_model
from generation.streams import InMemoryStreamStore, StreamStore

if TYPE_CHECKING:
    from generation.admission import Admission
    from generation.dispatch import CeleryDispatcher

logger = logging.getLogger(__name__)

# Who generates in this process: unique per process start, so a restarted process
# can tell its predecessor's unfinished answers from live ones.
PRODUCER = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

_lock = threading.Lock()
_store: StreamStore | None = None
_admission: Admission | None = None
# What runs each model's generations for this process: its own engine, or, in the web
# processes of GENERATION_BACKEND=celery, a dispatcher to the workers.
_engines: dict[str, Engine | CeleryDispatcher] = {}
# The engines of a Celery worker process (with the in-process backend they are _engines).
_worker_engines: dict[str, Engine] = {}


def stream_store() -> StreamStore:
    """Redis Streams when REDIS_URL is set (shared by all processes), else in memory."""
    global _store
    with _lock:
        if _store is None:
            if settings.REDIS_URL:
                from generation.redis_streams import RedisStreamStore

                _store = RedisStreamStore(settings.REDIS_URL, prefix=settings.REDIS_KEY_PREFIX)
            else:
                _store = InMemoryStreamStore()
        return _store


def model_names() -> list[str]:
    return available_models(settings.CHAT_MODEL, synthetic_enabled=settings.CHAT_ENABLE_SYNTHETIC)


def default_concurrency(spec: ModelSpec, scheduler: str, device: str) -> int:
    """Generations one engine runs at once when GENERATION_MAX_CONCURRENT is unset.

    The synthetic model only sleeps between words, so it runs many streams at once. A
    real model's batch grows with the hardware: a GPU decodes hundreds of rows in about
    the time of one; two CPU cores still gain up to about 32 (docs/benchmarks.md). Two
    sequential generate() calls side by side gain nothing.
    """
    if spec.synthetic:
        return 1024
    if scheduler == "sequential":
        return 1
    import torch

    on_gpu = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return 256 if on_gpu else 32


def engine(model: str | None = None) -> Engine | CeleryDispatcher:
    """What runs `model`'s generations (default CHAT_MODEL) for this web process, started.

    The process's own engine, or with GENERATION_BACKEND=celery, the dispatcher that
    queues them for the workers. Raises UnknownModel.
    """
    if settings.GENERATION_BACKEND != "celery":
        return local_engine(model)
    name = model or settings.CHAT_MODEL
    store, bound = stream_store(), admission()
    with _lock:
        if name not in _engines:
            from generation.dispatch import CeleryDispatcher

            spec = resolve_model(name, synthetic_enabled=settings.CHAT_ENABLE_SYNTHETIC)
            load = partial(
                load_chat_tokenizer,
                spec,
                cache_dir=settings.MODEL_CACHE_DIR,
                synthetic_tokens_per_s=settings.CHAT_SYNTHETIC_TOKENS_PER_S,
            )
            _engines[name] = CeleryDispatcher(name, load, store, bound)
        found = _engines[name]
    found.start()
    return found


def local_engine(model: str | None = None) -> Engine:
    """This process's engine for `model` (default CHAT_MODEL), started; raises UnknownModel.

    Web processes use it through engine(); Celery generation workers use it directly.
    """
    name = model or settings.CHAT_MODEL
    store = stream_store()
    own: dict[str, Any] = _worker_engines if settings.GENERATION_BACKEND == "celery" else _engines
    with _lock:
        if name not in own:
            spec = resolve_model(name, synthetic_enabled=settings.CHAT_ENABLE_SYNTHETIC)
            load = partial(
                load_generator,
                spec,
                cache_dir=settings.MODEL_CACHE_DIR,
                device=settings.CHAT_DEVICE,
                dtype=settings.CHAT_DTYPE,
                synthetic_tokens_per_s=settings.CHAT_SYNTHETIC_TOKENS_PER_S,
            )
            own[name] = Engine(
                load,
                store,
                scheduler=settings.GENERATION_SCHEDULER,
                max_queue=settings.GENERATION_MAX_QUEUE,
                max_concurrent=max_concurrent(spec),
                producer=PRODUCER,
            )
        found = own[name]
    found.start()
    return found  # type: ignore[no-any-return]


def worker_engines() -> dict[str, Engine]:
    """The engines of this Celery worker process, by model."""
    with _lock:
        return dict(_worker_engines)


def max_concurrent(spec: ModelSpec) -> int:
    return settings.GENERATION_MAX_CONCURRENT or default_concurrency(
        spec, settings.GENERATION_SCHEDULER, settings.CHAT_DEVICE
    )


def submit(task: GenerationTask) -> None:
    """Start a generation where this deployment runs them; raises EngineOverloaded."""
    runner = engine(task.model)
    if isinstance(runner, Engine):
        runner.submit(job_for(task))
    else:
        runner.submit(task)


def admission() -> Admission:
    """The cross-process admission bound (GENERATION_BACKEND=celery; needs REDIS_URL)."""
    global _admission
    with _lock:
        if _admission is None:
            from generation.admission import Admission

            assert settings.REDIS_URL, "GENERATION_BACKEND=celery needs REDIS_URL"
            _admission = Admission(
                settings.REDIS_URL, prefix=settings.REDIS_KEY_PREFIX, max_queue=settings.GENERATION_MAX_QUEUE
            )
        return _admission


def engines() -> dict[str, Engine | CeleryDispatcher]:
    """What engine() has handed out so far, by model (the admin and metrics show them)."""
    with _lock:
        return dict(_engines)


def start() -> None:
    """At server start: load the default model; with the in-process backend, housekeep."""
    engine()
    if settings.GENERATION_BACKEND != "celery":
        threading.Thread(target=_housekeep_inline, name="chatsite-housekeeping", daemon=True).start()


def _housekeep_inline() -> None:
    """Run Celery beat's schedule in this process, for the in-process backend.

    Without workers there is no beat process: the one web process settles the answers
    of a predecessor that died (at once, and again as heartbeats lapse), rolls usage up
    and expires streams, on beat's schedule, calling the same tasks.
    """
    from django.db import close_old_connections

    from chatsite.celery import app

    app.loader.import_default_modules()
    entries: list[dict[str, Any]] = list(settings.CELERY_BEAT_SCHEDULE.values())
    schedule = {entry["task"]: float(entry["schedule"]) for entry in entries}
    due = dict.fromkeys(schedule, 0.0)
    while True:
        for task, period_s in schedule.items():
            if time.monotonic() >= due[task]:
                due[task] = time.monotonic() + period_s
                try:
                    app.tasks[task]()
                except Exception:
                    logger.exception("Housekeeping task %s failed", task)
                finally:
                    close_old_connections()
        time.sleep(max(0.0, min(due.values()) - time.monotonic()))
