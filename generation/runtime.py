"""The process's stream store and engines, built from settings on first use."""

from __future__ import annotations

import threading
from functools import partial

from django.conf import settings

from generation.engine import Engine
from generation.generators import load_generator
from generation.registry import available_models, resolve_model
from generation.streams import InMemoryStreamStore, StreamStore

_lock = threading.Lock()
_store: StreamStore | None = None
_engines: dict[str, Engine] = {}


def stream_store() -> StreamStore:
    global _store
    with _lock:
        if _store is None:
            _store = InMemoryStreamStore()
        return _store


def model_names() -> list[str]:
    return available_models(settings.CHAT_MODEL, synthetic_enabled=settings.CHAT_ENABLE_SYNTHETIC)


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
                synthetic_tokens_per_s=settings.CHAT_SYNTHETIC_TOKENS_PER_S,
            )
            _engines[name] = Engine(load, store, max_queue=settings.GENERATION_MAX_QUEUE)
        found = _engines[name]
    found.start()
    return found


def start() -> Engine:
    """Start loading the default model in the background."""
    return engine()


def engines() -> dict[str, Engine]:
    with _lock:
        return dict(_engines)
