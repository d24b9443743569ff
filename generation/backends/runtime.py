"""This process's runtime: one object holding its shared parts, each built from settings
on first use: the stream store, the engines it runs itself, the Redis admission bound and
the backend that runs generations (chosen by generation/backends/router.py).

A web process of the in-process backend and a Celery generation worker both run their
models through local_engine(). Tests give each test a runtime of its own with `use`.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from functools import partial

from django.conf import settings

from generation.residency import ORDERS_EVERY_S, model_residency_orders
from inference.admission import DeploymentAdmission
from inference.engine import Engine
from inference.generators import load_generator
from inference.redis_streams import RedisStreamStore
from inference.registry import ModelSpec, available_models, resolve_model
from inference.residency import ModelBudget
from inference.streams import InMemoryStreamStore, StreamStore
from infrastructure.database import on_database_thread
from infrastructure.metrics import observe_model_load

# Who generates in this process: unique per process start, so a restarted process
# can tell its predecessor's unfinished answers from live ones.
PRODUCER = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def model_names() -> list[str]:
    return available_models(settings.CHAT_MODEL, synthetic_enabled=settings.CHAT_ENABLE_SYNTHETIC)


def model_spec(model: str | None = None) -> ModelSpec:
    """The spec of `model` (default CHAT_MODEL); raises UnknownModel."""
    return resolve_model(model or settings.CHAT_MODEL, synthetic_enabled=settings.CHAT_ENABLE_SYNTHETIC)


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
    import torch  # only once a real model is configured: torch takes seconds to import

    on_gpu = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return 256 if on_gpu else 32


def max_concurrent(spec: ModelSpec) -> int:
    return settings.GENERATION_MAX_CONCURRENT or default_concurrency(
        spec, settings.GENERATION_SCHEDULER, settings.CHAT_DEVICE
    )


class Runtime:
    """This process's stream store, engines, admission bound and backend."""

    def __init__(self, *, store: StreamStore | None = None, admission: DeploymentAdmission | None = None) -> None:
        self._lock = threading.Lock()
        self._store = store
        self._admission = admission
        self.engines: dict[str, Engine] = {}  # by model; a test may put its own here
        self._budget: ModelBudget | None = None  # CHAT_MAX_LOADED_MODELS, over all its engines
        self.backend: object | None = None  # the ModelRouter, once router.backend() chose it

    def stream_store(self) -> StreamStore:
        """Redis Streams when REDIS_URL is set (shared by all processes), else in memory."""
        with self._lock:
            if self._store is None:
                if settings.REDIS_URL:
                    self._store = RedisStreamStore(settings.REDIS_URL, prefix=settings.REDIS_KEY_PREFIX)
                else:
                    self._store = InMemoryStreamStore()
            return self._store

    def local_engine(self, model: str | None = None) -> Engine:
        """This process's engine for `model` (default CHAT_MODEL), started; raises UnknownModel."""
        name = model or settings.CHAT_MODEL
        store = self.stream_store()
        with self._lock:
            if name not in self.engines:
                if self._budget is None:
                    self._budget = ModelBudget(settings.CHAT_MAX_LOADED_MODELS)
                self.engines[name] = _engine_for(model_spec(name), store, self._budget)
            found = self.engines[name]
        found.start()
        return found

    def local_engines(self) -> dict[str, Engine]:
        """The engines this process runs, by model."""
        with self._lock:
            return dict(self.engines)

    def admission(self) -> DeploymentAdmission:
        """The deployment-wide bound on running plus waiting generations, in Redis."""
        with self._lock:
            if self._admission is None:
                assert settings.REDIS_URL, "the admission bound lives in Redis: REDIS_URL is needed"
                self._admission = DeploymentAdmission(
                    settings.REDIS_URL, prefix=settings.REDIS_KEY_PREFIX, max_queue=settings.GENERATION_MAX_QUEUE
                )
            return self._admission


def _engine_for(spec: ModelSpec, store: StreamStore, budget: ModelBudget) -> Engine:
    load = partial(
        load_generator,
        spec,
        cache_dir=settings.MODEL_CACHE_DIR,
        device=settings.CHAT_DEVICE,
        dtype=settings.CHAT_DTYPE,
        quantization=settings.CHAT_QUANTIZATION,
        synthetic_tokens_per_s=settings.CHAT_SYNTHETIC_TOKENS_PER_S,
    )
    return Engine(
        load,
        store,
        scheduler=settings.GENERATION_SCHEDULER,
        max_queue=settings.GENERATION_MAX_QUEUE,
        max_concurrent=max_concurrent(spec),
        producer=PRODUCER,
        cuda_graphs=settings.GENERATION_CUDA_GRAPHS,
        slot_tokens=settings.GENERATION_SLOT_TOKENS,
        compiled=settings.GENERATION_COMPILE,
        prefix_cache_mb=settings.GENERATION_PREFIX_CACHE_MB,
        threads=settings.GENERATION_THREADS,
        idle_unload_s=settings.CHAT_MODEL_IDLE_UNLOAD_S,
        on_loaded=partial(observe_model_load, spec.name),
        # The admin's "unload now" and "keep warm", and plans' pins, from the database.
        orders=partial(on_database_thread, model_residency_orders, spec.name),
        orders_every_s=ORDERS_EVERY_S,
        budget=budget,
    )


_current = Runtime()


def current() -> Runtime:
    return _current


def use(runtime: Runtime) -> Runtime:
    """Make `runtime` this process's from now on, and return the one it replaces (tests:
    a fresh store, engines and backend for each test)."""
    global _current
    previous, _current = _current, runtime
    return previous


# The parts of the current runtime, for callers that need one of them.
def stream_store() -> StreamStore:
    return _current.stream_store()


def local_engine(model: str | None = None) -> Engine:
    return _current.local_engine(model)


def local_engines() -> dict[str, Engine]:
    return _current.local_engines()


def admission() -> DeploymentAdmission:
    return _current.admission()
