"""The eager scheduler, for tests: a job runs to its end inside submit(), in the caller's
thread, its saves with it (as Celery's task_always_eager runs a task)."""

from __future__ import annotations

import threading

from inference.engine import EAGER, Engine, Job
from inference.generators import SyntheticGenerator
from inference.streams import InMemoryStreamStore

PROMPT = [{"role": "user", "content": "Name three colours."}]


def test_submit_returns_with_the_answer_written_saved_and_ended_in_the_callers_thread():
    store = InMemoryStreamStore()
    engine = Engine(lambda: SyntheticGenerator(tokens_per_s=100_000, answer_words=3), store, scheduler=EAGER)
    saved_on: list[threading.Thread] = []
    results = []

    def save(result):
        saved_on.append(threading.current_thread())
        results.append(result)

    engine.submit(Job("s1", PROMPT, on_finish=save))

    events = store.events("s1")
    assert [event.type for event in events] == ["token", "token", "token", "done"]
    assert saved_on == [threading.current_thread()]
    assert results[0].completion_tokens == 3
    assert engine.active == 0
    engine.stop(5)


def test_a_failing_save_still_ends_the_stream_and_submit_does_not_raise():
    store = InMemoryStreamStore()
    engine = Engine(lambda: SyntheticGenerator(tokens_per_s=100_000, answer_words=2), store, scheduler=EAGER)

    def broken_save(result):
        raise RuntimeError("database down")

    engine.submit(Job("s1", PROMPT, on_finish=broken_save))

    assert store.events("s1")[-1].type == "done"
    engine.stop(5)
