"""Engines for tests: install one for the chat model, and wait on what it does."""

from __future__ import annotations

import time
from collections.abc import Callable

from django.conf import settings as django_settings

from generation.backends import runtime
from inference.engine import Engine
from inference.generators import Generator
from inference.streams import InMemoryStreamStore, StreamEvent


def install_engine(store: InMemoryStreamStore, generator: Generator, **kwargs) -> Engine:
    engine = Engine(lambda: generator, store, producer=runtime.PRODUCER, **kwargs)
    engine.start()
    assert engine.wait_ready(30)
    runtime.current().engines[django_settings.CHAT_MODEL] = engine
    return engine


def wait_for_terminal(store: InMemoryStreamStore, stream_id: str, timeout: float = 60) -> list[StreamEvent]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = store.events(stream_id)
        if events and events[-1].terminal:
            return events
        time.sleep(0.01)
    raise AssertionError(f"stream {stream_id} did not end within {timeout} s")


def wait_until(condition: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)
