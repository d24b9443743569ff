"""The process's stream store and engines, built from settings on first use."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from functools import partial

from django.conf import settings

from generation.engine import Engine
from generation.generators import load_generator
from generation.registry import ModelSpec, available_models, resolve_model
from generation.streams import InMemoryStreamStore, StreamStore

logger = logging.getLogger(__name__)

# Who generates in this process: unique per process start, so a restarted process
# can tell its predecessor's unfinished answers from live ones.
PRODUCER = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

_lock = threading.Lock()
_store: StreamStore | None = None
_engines: dict[str, Engine] = {}


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


def engine(model: str | None = None) -> Engine:
    """The started engine for `model` (default CHAT_MODEL); raises UnknownModel."""
    name = model or settings.CHAT_MODEL
    store = stream_store()
    with _lock:
        if name not in _engines:
            spec = resolve_model(name, synthetic_enabled=settings.CHAT_ENABLE_SYNTHETIC)
            load = partial(
                load_generator,
                spec,
                cache_dir=settings.MODEL_CACHE_DIR,
                device=settings.CHAT_DEVICE,
                dtype=settings.CHAT_DTYPE,
                synthetic_tokens_per_s=settings.CHAT_SYNTHETIC_TOKENS_PER_S,
            )
            _engines[name] = Engine(
                load,
                store,
                scheduler=settings.GENERATION_SCHEDULER,
                max_queue=settings.GENERATION_MAX_QUEUE,
                max_concurrent=settings.GENERATION_MAX_CONCURRENT
                or default_concurrency(spec, settings.GENERATION_SCHEDULER, settings.CHAT_DEVICE),
                producer=PRODUCER,
            )
        found = _engines[name]
    found.start()
    return found


def engines() -> dict[str, Engine]:
    with _lock:
        return dict(_engines)


def start() -> None:
    """At server start: load the default model, and settle answers left by dead processes."""
    engine()
    threading.Thread(target=_settle_orphans_twice, name="chatsite-settle", daemon=True).start()


def _settle_orphans_twice() -> None:
    from generation.services import messages_settle_orphans

    # Once now, and once after a dead predecessor's heartbeat has surely expired
    # (a process restarted within that time still looks alive at first).
    for delay in (0.0, Engine.HEARTBEAT_S * 3 + 1):
        time.sleep(delay)
        try:
            settled = messages_settle_orphans()
        except Exception:
            logger.exception("Could not settle interrupted answers")
            return
        if settled:
            logger.info("Marked %d answers of stopped processes as interrupted", settled)
