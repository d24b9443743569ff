"""This process's shared parts, built from settings on first use: the stream store, the
engines it runs itself, and the Redis admission bound.

Which backend runs generations is decided once, in generation/backends.py; nothing here
depends on it. A web process of the in-process backend and a Celery generation worker
both run their models through local_engine().
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from functools import partial

from django.conf import settings

from inference.admission import Admission
from inference.engine import Engine
from inference.generators import load_generator
from inference.redis_streams import RedisStreamStore
from inference.registry import ModelSpec, available_models, resolve_model
from inference.streams import InMemoryStreamStore, StreamStore

# Who generates in this process: unique per process start, so a restarted process
# can tell its predecessor's unfinished answers from live ones.
PRODUCER = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

_lock = threading.Lock()
_store: StreamStore | None = None
_admission: Admission | None = None
_engines: dict[str, Engine] = {}


def stream_store() -> StreamStore:
    """Redis Streams when REDIS_URL is set (shared by all processes), else in memory."""
    global _store
    with _lock:
        if _store is None:
            if settings.REDIS_URL:
                _store = RedisStreamStore(settings.REDIS_URL, prefix=settings.REDIS_KEY_PREFIX)
            else:
                _store = InMemoryStreamStore()
        return _store


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


def local_engine(model: str | None = None) -> Engine:
    """This process's engine for `model` (default CHAT_MODEL), started; raises UnknownModel."""
    name = model or settings.CHAT_MODEL
    store = stream_store()
    with _lock:
        if name not in _engines:
            spec = model_spec(name)
            load = partial(
                load_generator,
                spec,
                cache_dir=settings.MODEL_CACHE_DIR,
                device=settings.CHAT_DEVICE,
                dtype=settings.CHAT_DTYPE,
                quantization=settings.CHAT_QUANTIZATION,
                synthetic_tokens_per_s=settings.CHAT_SYNTHETIC_TOKENS_PER_S,
            )
            _engines[name] = Engine(
                load,
                store,
                scheduler=settings.GENERATION_SCHEDULER,
                max_queue=settings.GENERATION_MAX_QUEUE,
                max_concurrent=max_concurrent(spec),
                producer=PRODUCER,
                cuda_graphs=settings.GENERATION_CUDA_GRAPHS,
                slot_tokens=settings.GENERATION_SLOT_TOKENS,
            )
        found = _engines[name]
    found.start()
    return found


def local_engines() -> dict[str, Engine]:
    """The engines this process runs, by model."""
    with _lock:
        return dict(_engines)


def admission() -> Admission:
    """The deployment-wide bound on running plus waiting generations, in Redis."""
    global _admission
    with _lock:
        if _admission is None:
            assert settings.REDIS_URL, "the admission bound lives in Redis: REDIS_URL is needed"
            _admission = Admission(
                settings.REDIS_URL, prefix=settings.REDIS_KEY_PREFIX, max_queue=settings.GENERATION_MAX_QUEUE
            )
        return _admission
