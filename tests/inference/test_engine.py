from __future__ import annotations

import itertools
import threading

import pytest

from inference.engine import Engine, EngineOverloaded, GenerationResult, Job, failure_message
from inference.generators import GenerationParams, SyntheticGenerator
from inference.streams import InMemoryStreamStore, interrupted_event
from tests.support.engines import install_engine, wait_for_terminal, wait_until

GREEDY = GenerationParams(max_tokens=12, temperature=0)
PROMPT = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(params=["batched", "sequential"], autouse=True)
def scheduler(request) -> str:
    """Every engine test runs under both schedulers."""
    return request.param


@pytest.fixture
def real_engine(stream_store, smollm, scheduler):
    engine = install_engine(stream_store, smollm, scheduler=scheduler, max_concurrent=4)
    yield engine
    engine.stop(timeout=30)


def test_greedy_generation_streams_numbered_tokens_then_one_done(real_engine, smollm):
    finished: list[GenerationResult] = []
    real_engine.submit(Job("s1", PROMPT, GREEDY, on_finish=finished.append))

    events = wait_for_terminal(real_engine.store, "s1")

    tokens, done = events[:-1], events[-1]
    assert len(tokens) >= 3
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert {e.type for e in tokens} == {"token"}
    assert done.type == "done"
    usage = done.data["usage"]
    assert usage["prompt_tokens"] > 5
    assert usage["completion_tokens"] == 12
    assert done.data["finish_reason"] == "length"
    assert done.data["timings"]["ttft_ms"] > 0
    # The streamed text is exactly what a plain greedy generate() produces.
    inputs = smollm.tokenizer.apply_chat_template(
        PROMPT, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    output = smollm.model.generate(**inputs, max_new_tokens=12, do_sample=False)
    expected = smollm.tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    streamed = "".join(e.data["delta"] for e in tokens)
    assert streamed == expected
    assert finished[0].text == streamed
    assert finished[0].status == "complete"


def test_model_that_ends_its_answer_reports_stop(real_engine):
    real_engine.submit(
        Job(
            "s1",
            [{"role": "user", "content": "Reply with just the word: yes"}],
            GenerationParams(max_tokens=64, temperature=0),
        )
    )
    done = wait_for_terminal(real_engine.store, "s1")[-1]
    assert done.data["finish_reason"] == "stop"
    assert done.data["usage"]["completion_tokens"] < 64


def test_cancel_stops_generation_within_a_step(real_engine):
    long = GenerationParams(max_tokens=300, temperature=0)
    finished: list[GenerationResult] = []
    real_engine.submit(
        Job("s1", [{"role": "user", "content": "Write a long story about a dragon."}], long, on_finish=finished.append)
    )
    wait_until(lambda: len(real_engine.store.events("s1")) >= 3)

    real_engine.cancel("s1")
    events = wait_for_terminal(real_engine.store, "s1")

    done = events[-1]
    assert done.data["finish_reason"] == "cancelled"
    assert done.data["status"] == "stopped"
    # One step may already be under way when the flag is set.
    cancelled_at = sum(1 for e in events if e.type == "token")
    assert done.data["usage"]["completion_tokens"] <= cancelled_at + 2 < 300
    assert finished[0].text == "".join(e.data["delta"] for e in events[:-1])


def test_progress_is_saved_while_streaming(scheduler):
    store = InMemoryStreamStore()
    engine = Engine(
        lambda: SyntheticGenerator(tokens_per_s=200, answer_words=40),
        store,
        progress_interval_s=0.05,
        scheduler=scheduler,
    )
    saved: list[str] = []
    engine.submit(Job("s1", PROMPT, on_progress=saved.append))
    wait_for_terminal(store, "s1")
    engine.stop(5)
    assert len(saved) >= 2
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(saved))


def test_job_cancelled_while_queued_never_runs(scheduler):
    store = InMemoryStreamStore()
    engine = Engine(lambda: SyntheticGenerator(tokens_per_s=100, answer_words=20), store, scheduler=scheduler)
    engine.submit(Job("first", PROMPT))
    engine.submit(Job("second", PROMPT))
    engine.cancel("second")
    events = wait_for_terminal(store, "second")
    engine.stop(5)
    # Queued, then ended without a token (batched: at once; sequential: at its turn).
    assert events[0].data == {"state": "queued", "ahead": 0}
    assert "token" not in {e.type for e in events}
    assert events[-1].data["status"] == "stopped"
    assert events[-1].data["usage"]["completion_tokens"] == 0


def test_queue_refuses_beyond_its_bound(scheduler):
    store = InMemoryStreamStore()
    release = threading.Event()

    def slow_load():
        release.wait(10)
        return SyntheticGenerator(tokens_per_s=1000, answer_words=1)

    engine = Engine(slow_load, store, max_concurrent=1, max_queue=2, scheduler=scheduler)
    for name in ("a", "b", "c"):  # one to run once the model is there, two waiting
        engine.submit(Job(name, PROMPT))
    with pytest.raises(EngineOverloaded):
        engine.submit(Job("d", PROMPT))
    assert not store.exists("d")
    release.set()
    assert wait_for_terminal(store, "c")[-1].type == "done"
    engine.stop(5)


def test_a_model_that_fails_to_load_ends_each_stream_with_an_error(scheduler, caplog):
    store = InMemoryStreamStore()

    def broken_load():
        raise OSError("weights missing")

    engine = Engine(broken_load, store, scheduler=scheduler)
    engine.submit(Job("s1", PROMPT))
    events = wait_for_terminal(store, "s1")
    engine.stop(5)
    assert not engine.ready
    assert "weights missing" in (engine.load_error or "")
    assert [e.type for e in events] == ["error"]
    # Readers get a reference; the log has why, under it.
    assert events[0].data["message"] == failure_message("s1")
    assert any(
        "s1" in r.getMessage() and "not loaded (OSError: weights missing)" in str(r.exc_info[1])
        for r in caplog.records
        if r.exc_info
    )


def test_prompt_longer_than_the_context_is_an_error_event(real_engine, monkeypatch):
    monkeypatch.setattr(real_engine.generator, "context_length", 16)
    finished: list[GenerationResult] = []
    real_engine.submit(Job("s1", [{"role": "user", "content": "word " * 40}], GREEDY, on_finish=finished.append))
    events = wait_for_terminal(real_engine.store, "s1")
    assert [e.type for e in events] == ["error"]
    assert "context" in events[0].data["message"]
    assert finished[0].status == "error"


def test_a_failing_save_callback_still_ends_the_stream(scheduler):
    store = InMemoryStreamStore()
    engine = Engine(lambda: SyntheticGenerator(tokens_per_s=1000, answer_words=3), store, scheduler=scheduler)

    def broken_save(result):
        raise RuntimeError("database down")

    engine.submit(Job("s1", PROMPT, on_finish=broken_save))
    assert wait_for_terminal(store, "s1")[-1].type == "done"
    engine.stop(5)


def test_engine_runs_up_to_max_concurrent_jobs_at_once(scheduler):
    store = InMemoryStreamStore()
    engine = Engine(
        lambda: SyntheticGenerator(tokens_per_s=20, answer_words=40), store, max_concurrent=4, scheduler=scheduler
    )
    for n in range(4):
        engine.submit(Job(f"s{n}", PROMPT))
    wait_until(lambda: engine.active == 4, timeout=5)
    engine.submit(Job("s4", PROMPT))
    assert engine.queued == 1  # the fifth waits for a free worker
    for n in range(5):
        wait_for_terminal(store, f"s{n}")
    engine.stop(5)
    assert engine.active == 0


class _ThreadCounting(SyntheticGenerator):
    """Notes torch's thread count on the thread that generates (the engine's own)."""

    seen: list[int]

    def count_prompt_tokens(self, prompt):
        import torch

        self.seen.append(torch.get_num_threads())
        return super().count_prompt_tokens(prompt)


def test_generation_threads_set_the_engines_torch_threads_not_the_callers(scheduler):
    import torch

    generator = _ThreadCounting(tokens_per_s=200, answer_words=2)
    generator.seen = []
    before = torch.get_num_threads()
    store = InMemoryStreamStore()
    engine = Engine(lambda: generator, store, scheduler=scheduler, threads=before + 1)
    engine.submit(Job("s1", PROMPT))
    wait_for_terminal(store, "s1")
    engine.stop(5)
    assert generator.seen and set(generator.seen) == {before + 1}
    assert torch.get_num_threads() == before


def test_engine_beats_as_its_producer_while_running(scheduler):
    store = InMemoryStreamStore()
    engine = Engine(lambda: SyntheticGenerator(tokens_per_s=100), store, producer="web-1", scheduler=scheduler)
    assert not store.producer_alive("web-1")
    engine.start()
    wait_until(lambda: store.producer_alive("web-1"), timeout=5)
    engine.stop(5)


def test_shut_down_lets_short_answers_finish_then_interrupts_the_rest_with_their_text(stream_store, scheduler):
    engine = Engine(
        lambda: SyntheticGenerator(tokens_per_s=50, answer_words=10_000),
        stream_store,
        scheduler=scheduler,
        max_concurrent=2,
    )
    engine.start()
    assert engine.wait_ready(30)
    finished: dict[str, GenerationResult] = {}

    def job(stream_id: str, max_tokens: int) -> Job:
        params = GenerationParams(max_tokens=max_tokens)
        return Job(stream_id, PROMPT, params, on_finish=lambda result: finished.setdefault(stream_id, result))

    engine.submit(job("short", 10))  # 0.2 s
    engine.submit(job("long", 5_000))  # 100 s
    engine.submit(job("next", 5_000))  # takes the short one's row
    engine.submit(job("waiting", 5_000))  # behind the long ones: never starts
    wait_until(lambda: any(e.type == "token" for e in stream_store.events("long")))

    engine.shut_down(grace_s=1.0)

    assert finished["short"].status == "complete"
    assert finished["short"].completion_tokens == 10
    long = finished["long"]
    assert long.status == "interrupted"
    assert long.text
    assert long.error.startswith("The server stopped")
    assert finished["next"].status == "interrupted"
    assert finished["next"].text
    assert finished["waiting"].status == "interrupted"
    assert finished["waiting"].text == ""
    terminal = stream_store.events("long")[-1]
    assert terminal.type == "error"
    assert terminal.data["message"] == "interrupted"
    with pytest.raises(EngineOverloaded):
        engine.submit(job("late", 5))
    assert not engine.ready
    assert not engine.busy()


def test_an_interrupted_answer_ends_with_the_one_error_event_readers_know():
    kind, data = interrupted_event(status="complete", finish_reason="error", usage={"completion_tokens": 3})

    assert kind == "error"
    assert data["message"] == "interrupted"
    assert data["status"] == "interrupted"  # whatever the summary it carries said
    assert data["usage"] == {"completion_tokens": 3}
