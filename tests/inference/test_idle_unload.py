"""Idle unload (CHAT_MODEL_IDLE_UNLOAD_S): the model leaves memory after a while with
nothing to do, and the next generation loads it again, once, its readers told first."""

from __future__ import annotations

import threading
import time
from functools import partial
from pathlib import Path

import pytest
from django.conf import settings

from inference import engine as engine_module
from inference.engine import Engine, Job
from inference.generators import GenerationParams, Generator, SyntheticGenerator, load_generator
from inference.registry import resolve_model
from inference.residency import Residency
from inference.streams import InMemoryStreamStore
from tests.support.engines import wait_for_terminal, wait_until

IDLE_S = 0.2
PROMPT = [{"role": "user", "content": "Name three colours."}]
SHORT = GenerationParams(max_tokens=3)


@pytest.fixture(params=["batched", "sequential"])
def scheduler(request) -> str:
    return request.param


class CountedLoad:
    """A model load that counts its calls; `gate` holds each load until set, `failing` fails it."""

    def __init__(self, tokens_per_s: float = 1000) -> None:
        self.count = 0
        self.tokens_per_s = tokens_per_s
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.failing = False

    def __call__(self) -> Generator:
        self.count += 1
        self.started.set()
        assert self.gate.wait(10)
        if self.failing:
            raise OSError("weights missing")
        return SyntheticGenerator(tokens_per_s=self.tokens_per_s, answer_words=3)


@pytest.fixture
def load() -> CountedLoad:
    return CountedLoad()


@pytest.fixture
def engine(load, scheduler):
    engine = Engine(load, InMemoryStreamStore(), scheduler=scheduler, max_concurrent=2, idle_unload_s=IDLE_S)
    engine.start()
    assert engine.wait_ready(10)
    yield engine
    engine.stop(5)


def run(engine: Engine, stream_id: str, params: GenerationParams = SHORT) -> list:
    engine.submit(Job(stream_id, PROMPT, params))
    return wait_for_terminal(engine.store, stream_id, timeout=10)


def unloaded(engine: Engine) -> None:
    wait_until(lambda: engine.residency == Residency.UNLOADED, timeout=5)


def test_the_model_leaves_memory_after_the_idle_time_and_stays_ready(engine, load):
    assert run(engine, "a")[-1].type == "done"
    assert engine.loaded
    unloaded(engine)
    assert engine.generator is None
    assert engine.ready  # /readyz stays 200
    assert engine.tokenizer is not None  # prompts are still counted before they queue
    assert load.count == 1


def test_the_next_job_loads_it_again_and_its_stream_says_so_first(engine, load):
    run(engine, "a")
    unloaded(engine)
    events = run(engine, "b")
    assert (events[0].type, events[0].data) == ("status", {"state": "loading"})
    assert [e.type for e in events[1:]] == ["token"] * 3 + ["done"]
    assert load.count == 2
    assert engine.loaded


def test_a_job_while_loaded_hears_nothing_of_loading(engine):
    assert [e.type for e in run(engine, "a")] == ["token"] * 3 + ["done"]


def test_jobs_racing_the_load_load_it_once_and_all_run(engine, load):
    run(engine, "a")
    unloaded(engine)
    load.gate.clear()
    load.started.clear()
    engine.submit(Job("b", PROMPT, SHORT))
    assert load.started.wait(5)
    assert engine.residency == Residency.RELOADING
    assert engine.ready  # still serving: it loads
    for stream_id in ("c", "d", "e"):  # come during the load: they wait for it
        engine.submit(Job(stream_id, PROMPT, SHORT))
    load.gate.set()
    for stream_id in "bcde":
        events = wait_for_terminal(engine.store, stream_id, timeout=10)
        assert events[0].data == {"state": "loading"}
        assert events[-1].type == "done"
    assert load.count == 2


def test_a_reload_that_fails_ends_every_waiting_job_with_an_error_then_the_next_tries_again(engine, load):
    run(engine, "a")
    unloaded(engine)
    load.gate.clear()
    load.started.clear()
    load.failing = True
    engine.submit(Job("b", PROMPT, SHORT))
    assert load.started.wait(5)
    for stream_id in ("c", "d", "e"):
        engine.submit(Job(stream_id, PROMPT, SHORT))
    load.gate.set()
    for stream_id in "bcde":
        events = wait_for_terminal(engine.store, stream_id, timeout=10)
        assert events[0].data == {"state": "loading"}
        assert events[-1].type == "error"
        assert "token" not in {e.type for e in events}
    assert load.count == 2  # one try for all of them
    assert not engine.ready
    assert "weights missing" in (engine.load_error or "")

    load.failing = False
    events = run(engine, "f")
    assert [e.type for e in events] == ["status"] + ["token"] * 3 + ["done"]
    assert load.count == 3
    assert engine.ready and engine.load_error is None


def test_nothing_unloads_while_a_job_runs_or_waits(load, scheduler):
    load.tokens_per_s = 10  # each answer: 3 words, 0.3 s
    engine = Engine(load, InMemoryStreamStore(), scheduler=scheduler, max_concurrent=1, idle_unload_s=IDLE_S)
    engine.start()
    try:
        assert engine.wait_ready(10)
        engine.submit(Job("a", PROMPT, SHORT))
        engine.submit(Job("b", PROMPT, SHORT))  # waits its turn behind a
        states = set()
        while not engine.store.events("b") or not engine.store.events("b")[-1].terminal:
            states.add(engine.residency)
            time.sleep(0.01)
        assert states == {Residency.LOADED}
        assert load.count == 1
        unloaded(engine)  # idle from here on
    finally:
        engine.stop(5)


def test_zero_never_unloads(load, scheduler):
    engine = Engine(load, InMemoryStreamStore(), scheduler=scheduler)
    engine.start()
    try:
        assert engine.wait_ready(10)
        run(engine, "a")
        time.sleep(3 * IDLE_S)
        assert engine.loaded
        assert [thread.name for thread in engine._threads if "unload" in thread.name] == []
    finally:
        engine.stop(5)


def test_the_model_is_freed_once_loaded_even_with_no_job_at_all(load, scheduler):
    engine = Engine(load, InMemoryStreamStore(), scheduler=scheduler, idle_unload_s=IDLE_S)
    engine.start()
    try:
        assert engine.wait_ready(10)
        unloaded(engine)
        assert load.count == 1
    finally:
        engine.stop(5)


def test_loads_are_timed(scheduler):
    times: list[float] = []
    engine = Engine(
        lambda: SyntheticGenerator(1000), InMemoryStreamStore(), idle_unload_s=IDLE_S, on_loaded=times.append
    )
    engine.start()
    try:
        assert engine.wait_ready(10)
        unloaded(engine)
        run(engine, "a")
        assert len(times) == 2 and all(t >= 0 for t in times)
    finally:
        engine.stop(5)


def test_a_job_that_comes_while_the_model_is_being_freed_loads_it_again(engine, load, monkeypatch):
    freeing, freed = threading.Event(), threading.Event()

    def slow_free() -> None:
        freeing.set()
        assert freed.wait(5)

    monkeypatch.setattr(engine_module, "free_memory", slow_free)
    run(engine, "a")
    assert freeing.wait(5)  # the model is let go; its memory is being handed back
    engine.submit(Job("b", PROMPT, SHORT))
    freed.set()
    events = wait_for_terminal(engine.store, "b", timeout=10)
    assert events[0].data == {"state": "loading"}
    assert events[-1].type == "done"
    assert load.count == 2


def vm_rss() -> int:
    """This process's resident memory, in bytes (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.slow  # loads the model twice: about 7 s here
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/self/status")
def test_the_real_model_gives_its_memory_back_and_answers_the_same_after_it_loads_again():
    spec = resolve_model("smollm2-135m-instruct")
    load = partial(
        load_generator,
        spec,
        cache_dir=settings.MODEL_CACHE_DIR,
        device="cpu",
        dtype="float32",
        synthetic_tokens_per_s=50,
    )
    greedy = GenerationParams(max_tokens=8, temperature=0)
    engine = Engine(load, InMemoryStreamStore(), max_concurrent=2, idle_unload_s=0.5)
    engine.start()
    try:
        assert engine.wait_ready(120)
        first = run(engine, "a", greedy)
        loaded_rss = vm_rss()
        unloaded(engine)
        # SmolLM2-135M in float32: about 540 MB of weights (bench/idle_unload.py: 514 MiB come back).
        wait_until(lambda: loaded_rss - vm_rss() > 400 * 2**20, timeout=10)
        assert engine.tokenizer is not None and engine.tokenizer.count_prompt_tokens(PROMPT) > 5

        second = run(engine, "b", greedy)
        assert second[0].data == {"state": "loading"}
        assert text_of(second) == text_of(first) != ""
        assert engine.loaded
    finally:
        engine.stop(10)


def text_of(events: list) -> str:
    return "".join(e.data["delta"] for e in events if e.type == "token")
