"""Batched decoding: generations that share forward passes each get what they would alone."""

from __future__ import annotations

import threading
import time

import pytest

from inference.batching import Sequence, open_batch
from inference.engine import Engine, EngineOverloaded, Job, failure_message
from inference.generators import GenerationParams, SyntheticGenerator
from inference.streams import InMemoryStreamStore
from tests.support.engines import install_engine, wait_for_terminal, wait_until

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in two sentences.",
    "Why is the sky blue?",
    "Tell me a joke about cats.",
]


def chat(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def greedy(max_tokens: int, **kwargs) -> GenerationParams:
    return GenerationParams(max_tokens=max_tokens, temperature=0, **kwargs)


@pytest.fixture(scope="module")
def alone(smollm):
    """Each prompt's greedy answer from a plain generate() call of its own."""
    answers: dict[tuple[str, int], str] = {}

    def answer(prompt: str, max_tokens: int) -> str:
        if (prompt, max_tokens) not in answers:
            pieces: list[str] = []
            smollm.generate(chat(prompt), greedy(max_tokens), pieces.append, lambda: False)
            answers[prompt, max_tokens] = "".join(pieces)
        return answers[prompt, max_tokens]

    return answer


@pytest.fixture
def batched_engine(stream_store, smollm):
    engine = install_engine(stream_store, smollm, scheduler="batched", max_concurrent=8)
    yield engine
    engine.stop(timeout=60)


def streamed_text(store: InMemoryStreamStore, stream_id: str) -> tuple[str, dict]:
    events = wait_for_terminal(store, stream_id, timeout=120)
    return "".join(e.data["delta"] for e in events if e.type == "token"), events[-1].data


def test_batched_greedy_output_equals_each_generation_alone(batched_engine, alone):
    for n, prompt in enumerate(PROMPTS):
        batched_engine.submit(Job(f"s{n}", chat(prompt), greedy(24)))
    for n, prompt in enumerate(PROMPTS):
        text, done = streamed_text(batched_engine.store, f"s{n}")
        assert text == alone(prompt, 24)
        assert done["status"] == "complete"


def test_the_batch_really_shares_steps(smollm):
    """Three rows take about as many steps as the longest of them, not the sum."""
    batch = open_batch(smollm)
    texts: list[list[str]] = [[], [], []]
    for n, prompt in enumerate(PROMPTS[1:4]):  # answers longer than 8 tokens
        batch.add(Sequence(chat(prompt), greedy(8), texts[n].append, lambda: False))
    steps, finished = 0, []
    while len(batch):
        finished += batch.step()
        steps += 1
    assert steps == 8
    assert len(finished) == 3
    assert all(outcome.completion_tokens == 8 and outcome.finish_reason == "length" for _, outcome in finished)


def test_a_generation_joining_mid_batch_disturbs_no_one(batched_engine, alone):
    store = batched_engine.store
    batched_engine.submit(Job("first", chat(PROMPTS[2]), greedy(40)))
    wait_until(lambda: sum(e.type == "token" for e in store.events("first")) >= 10, timeout=60)
    batched_engine.submit(Job("joiner", chat(PROMPTS[0]), greedy(20)))
    first, _ = streamed_text(store, "first")
    joiner, _ = streamed_text(store, "joiner")
    assert first == alone(PROMPTS[2], 40)
    assert joiner == alone(PROMPTS[0], 20)


def test_a_generation_cancelled_mid_batch_leaves_the_others_intact(batched_engine, alone):
    store = batched_engine.store
    for name, prompt in (("a", PROMPTS[1]), ("b", PROMPTS[3]), ("c", PROMPTS[4])):
        batched_engine.submit(Job(name, chat(prompt), greedy(32)))
    wait_until(lambda: sum(e.type == "token" for e in store.events("b")) >= 5, timeout=60)
    batched_engine.cancel("b")
    b, b_done = streamed_text(store, "b")
    assert b_done["finish_reason"] == "cancelled"
    assert b_done["usage"]["completion_tokens"] < 32
    assert alone(PROMPTS[3], 32).startswith(b)
    assert streamed_text(store, "a")[0] == alone(PROMPTS[1], 32)
    assert streamed_text(store, "c")[0] == alone(PROMPTS[4], 32)


def test_stop_sequences_and_max_tokens_hold_per_generation(batched_engine, alone):
    full = alone(PROMPTS[2], 32)
    stop = full.split()[4]  # a word from the middle of the answer
    batched_engine.submit(Job("stopped", chat(PROMPTS[2]), greedy(32, stop=(stop,))))
    batched_engine.submit(Job("short", chat(PROMPTS[1]), greedy(5)))
    batched_engine.submit(Job("plain", chat(PROMPTS[4]), greedy(32)))

    stopped, stopped_done = streamed_text(batched_engine.store, "stopped")
    assert stopped == full[: full.index(stop)]
    assert stopped_done["finish_reason"] == "stop"
    short, short_done = streamed_text(batched_engine.store, "short")
    assert short_done["usage"]["completion_tokens"] == 5
    assert short_done["finish_reason"] == "length"
    assert short == alone(PROMPTS[1], 5)
    assert streamed_text(batched_engine.store, "plain")[0] == alone(PROMPTS[4], 32)


def test_sampling_with_a_seed_repeats_whatever_else_is_in_the_batch(batched_engine):
    seeded = GenerationParams(max_tokens=16, temperature=0.9, top_p=0.9, seed=7)
    batched_engine.submit(Job("alone", chat(PROMPTS[4]), seeded))
    alone_text, _ = streamed_text(batched_engine.store, "alone")
    batched_engine.submit(Job("other", chat(PROMPTS[0]), GenerationParams(max_tokens=16, temperature=1.2, seed=1)))
    batched_engine.submit(Job("again", chat(PROMPTS[4]), seeded))
    again_text, _ = streamed_text(batched_engine.store, "again")
    other_text, _ = streamed_text(batched_engine.store, "other")
    assert again_text == alone_text
    assert other_text


def test_multibyte_characters_are_never_split(smollm):
    text = "Crème brûlée, 日本語, and a globe 🌍 — fine."
    decoder = smollm.token_text()
    pieces = [piece for token in smollm.tokenizer(text)["input_ids"] if (piece := decoder.step(token))]
    assert "".join(pieces) == text
    assert not any("\ufffd" in piece for piece in pieces)


def test_queue_refuses_beyond_its_bound_and_tells_waiters_their_place():
    store = InMemoryStreamStore()
    engine = Engine(lambda: SyntheticGenerator(tokens_per_s=20), store, max_concurrent=2, max_queue=2)
    for name, length in (("a", 5), ("b", 10), ("c", 5), ("d", 5)):  # a ends first, then b
        engine.submit(Job(name, chat("hi"), GenerationParams(max_tokens=length)))
    with pytest.raises(EngineOverloaded):
        engine.submit(Job("e", chat("hi")))
    assert not store.exists("e")
    wait_until(lambda: engine.active == 2, timeout=5)
    assert engine.queued == 2
    for name in ("a", "b", "c", "d"):
        wait_for_terminal(store, name)
    engine.stop(5)

    def statuses(name: str) -> list[dict]:
        return [e.data for e in store.events(name) if e.type == "status"]

    assert statuses("a") == statuses("b") == []
    assert statuses("c") == [{"state": "queued", "ahead": 0}, {"state": "running"}]
    assert statuses("d") == [{"state": "queued", "ahead": 1}, {"state": "queued", "ahead": 0}, {"state": "running"}]
    # Status events come before the answer's tokens.
    types = [e.type for e in store.events("d")]
    assert types.index("token") > max(i for i, kind in enumerate(types) if kind == "status")


def test_synthetic_batch_keeps_its_rate_for_many_streams():
    store = InMemoryStreamStore()
    engine = Engine(lambda: SyntheticGenerator(tokens_per_s=100), store, max_concurrent=200)
    started = time.monotonic()
    for n in range(200):
        engine.submit(Job(f"s{n}", chat("hi"), GenerationParams(max_tokens=20)))
    for n in range(200):
        assert wait_for_terminal(store, f"s{n}")[-1].data["usage"]["completion_tokens"] == 20
    elapsed = time.monotonic() - started
    engine.stop(5)
    # 20 words at 100/s each take 0.2 s at least; all 200 side by side take about that (one
    # after another would take 40 s): a bound far above the quiet figure, far below serial.
    assert 0.19 < elapsed < 4.0


def test_a_waiting_generation_cancelled_leaves_the_queue_at_once():
    store = InMemoryStreamStore()
    engine = Engine(lambda: SyntheticGenerator(tokens_per_s=20), store, max_concurrent=1)
    for name in ("running", "first", "second"):
        engine.submit(Job(name, chat("hi"), GenerationParams(max_tokens=40)))  # 2 s each
    wait_until(lambda: engine.queued == 2 and len(store.events("running")) > 0, timeout=5)

    store.cancel("first")  # as Stop does, from any process
    done = wait_for_terminal(store, "first", timeout=1)[-1]

    assert done.data["finish_reason"] == "cancelled"
    assert done.data["usage"]["completion_tokens"] == 0
    assert not store.events("running")[-1].terminal  # the running one goes on
    assert store.events("second")[-1].data == {"state": "queued", "ahead": 0}  # and "second" moved up
    store.cancel("running")
    store.cancel("second")
    wait_for_terminal(store, "second")
    engine.stop(5)


class OneLookPerStep(InMemoryStreamStore):
    """Records the batch's looks at the cancel flags; a look per row would fail."""

    def __init__(self) -> None:
        super().__init__()
        self.looks: list[list[str]] = []

    def cancelled_among(self, stream_ids: list[str]) -> set[str]:
        self.looks.append(sorted(stream_ids))
        return super().cancelled_among(stream_ids)

    def is_cancelled(self, stream_id: str) -> bool:
        raise AssertionError("the batch asks about every row at once")


def test_jobs_joining_a_batch_are_checked_for_cancellation_in_the_steps_one_look():
    store = OneLookPerStep()
    loaded = threading.Event()
    engine = Engine(lambda: loaded.wait() and SyntheticGenerator(tokens_per_s=100), store, max_concurrent=4)
    for name in ("a", "b", "c"):
        engine.submit(Job(name, chat("hi"), GenerationParams(max_tokens=5)))
    store.cancel("b")  # before the batch took it

    loaded.set()

    assert wait_for_terminal(store, "b")[-1].data["usage"]["completion_tokens"] == 0
    for name in ("a", "c"):
        assert wait_for_terminal(store, name)[-1].data["usage"]["completion_tokens"] == 5
    engine.stop(5)
    assert store.looks[0] == ["a", "b", "c"]  # the joining jobs together, in one call
    assert all(look == ["a", "c"] for look in store.looks[1:])  # then the rows running


@pytest.mark.slow  # bfloat16 matrix products without hardware support: about a minute
def test_bfloat16_batches_answer_like_the_model_alone():
    """In bfloat16 (the default on CPUs with bfloat16 arithmetic) a row's rounding depends
    on the batch's shape, so an answer may part from the one it gets alone: where two
    tokens tie in bfloat16 (on some CPUs " answer" and " sky" both score 17.625 after "Why
    is the sky blue?" and "The"), the batch's shape breaks the tie. Every answer starts
    the same, all but one go on the same for three words, and each is fluent text."""
    from django.conf import settings

    from inference.generators import load_generator
    from inference.registry import resolve_model

    bf16 = load_generator(
        resolve_model("smollm2-135m-instruct"),
        cache_dir=settings.MODEL_CACHE_DIR,
        device="cpu",
        dtype="bfloat16",
        synthetic_tokens_per_s=50,
    )
    assert str(bf16.model.dtype) == "torch.bfloat16"
    batch = open_batch(bf16)
    texts: list[list[str]] = [[] for _ in PROMPTS]
    for n, prompt in enumerate(PROMPTS):
        batch.add(Sequence(chat(prompt), greedy(12), texts[n].append, lambda: False))
    while len(batch):
        batch.step()
    parted = []
    for n, prompt in enumerate(PROMPTS):
        pieces: list[str] = []
        bf16.generate(chat(prompt), greedy(12), pieces.append, lambda: False)
        alone, batched = "".join(pieces).split(), "".join(texts[n]).split()
        assert batched[:1] == alone[:1] and len(batched) >= 5, (alone, batched)
        if batched[:3] != alone[:3]:
            parted.append((alone, batched))
    assert len(parted) <= 1, parted


def test_prompts_with_and_without_the_usual_template_opening_join_together(smollm):
    """Chats that open as the template usually does start after its cached opening; a chat
    with its own system prompt and a raw text prompt are prefilled whole, in the same step."""
    assert smollm.tokenizer.decode(smollm.template_prefix()).endswith("user\n")
    prompts = [
        chat(PROMPTS[3]),
        [{"role": "system", "content": "You are a pirate. Answer like one."}, {"role": "user", "content": PROMPTS[0]}],
        "The three primary colours are",
        chat(PROMPTS[1]),
    ]
    batch = open_batch(smollm)
    texts: list[list[str]] = [[] for _ in prompts]
    for prompt, pieces in zip(prompts, texts, strict=True):
        batch.add(Sequence(prompt, greedy(16), pieces.append, lambda: False))
    while len(batch):
        batch.step()
    for prompt, pieces in zip(prompts, texts, strict=True):
        alone: list[str] = []
        smollm.generate(prompt, greedy(16), alone.append, lambda: False)
        assert "".join(pieces) == "".join(alone)


def test_a_row_whose_stream_was_ended_from_outside_stops_and_the_others_go_on():
    store = InMemoryStreamStore()
    engine = Engine(lambda: SyntheticGenerator(tokens_per_s=50), store, max_concurrent=4)
    for name in ("kept", "ended"):
        engine.submit(Job(name, chat("hi"), GenerationParams(max_tokens=100)))
    wait_until(lambda: len(store.events("ended")) > 2, timeout=5)

    store.append("ended", "error", {"message": "interrupted"})  # e.g. settled by the reaper

    wait_until(lambda: engine.active == 1, timeout=2)  # its row left the batch
    assert not store.events("kept")[-1].terminal
    store.cancel("kept")
    assert wait_for_terminal(store, "kept")[-1].data["finish_reason"] == "cancelled"
    engine.stop(5)


def test_an_empty_prompt_fails_alone_and_never_joins_the_batch(batched_engine, alone):
    store = batched_engine.store
    batched_engine.submit(Job("before", chat(PROMPTS[0]), greedy(16)))
    batched_engine.submit(Job("empty", "", greedy(5)))
    batched_engine.submit(Job("after", chat(PROMPTS[3]), greedy(16)))

    empty = wait_for_terminal(store, "empty", timeout=120)
    assert empty[-1].type == "error"
    assert "empty" in empty[-1].data["message"]
    assert streamed_text(store, "before")[0] == alone(PROMPTS[0], 16)
    assert streamed_text(store, "after")[0] == alone(PROMPTS[3], 16)


def fail_forward_when(smollm, monkeypatch, poisoned) -> None:
    """A test double of a faulty row: the model's forward pass fails when `poisoned(kwargs)`."""
    forward = smollm.model.forward

    def failing_forward(*args, **kwargs):
        if poisoned(kwargs):
            raise RuntimeError("forward failed for a poisoned row")
        return forward(*args, **kwargs)

    monkeypatch.setattr(smollm.model, "forward", failing_forward)


def test_a_prompt_whose_prefill_fails_leaves_alone_and_the_prompts_joining_with_it_go_on(smollm, alone, monkeypatch):
    expected = {prompt: alone(prompt, 12) for prompt in PROMPTS[:2]}
    poisoned_prompt = chat("Tell me about the zebra.")
    [poison] = smollm.tokenizer.encode(" zebra")
    assert poison in smollm.encode(poisoned_prompt)["input_ids"][0].tolist()
    assert all(poison not in smollm.encode(chat(prompt))["input_ids"][0].tolist() for prompt in expected)
    fail_forward_when(smollm, monkeypatch, lambda kwargs: bool((kwargs["input_ids"] == poison).any()))
    batch = open_batch(smollm)
    texts: dict[str, list[str]] = {"a": [], "poisoned": [], "b": []}
    sequences = {
        name: Sequence(prompt, greedy(12), texts[name].append, lambda: False)
        for name, prompt in (("a", chat(PROMPTS[0])), ("poisoned", poisoned_prompt), ("b", chat(PROMPTS[1])))
    }
    for sequence in sequences.values():  # all three join at the same step: one prefill
        batch.add(sequence)

    outcomes = {}
    while len(batch):
        outcomes.update(batch.step())

    assert isinstance(outcomes[sequences["poisoned"]], RuntimeError)
    assert not texts["poisoned"]
    assert "".join(texts["a"]) == expected[PROMPTS[0]]
    assert "".join(texts["b"]) == expected[PROMPTS[1]]


def test_a_row_whose_decoding_step_fails_fails_alone_and_the_others_go_on(
    batched_engine, smollm, alone, monkeypatch, caplog
):
    short, long = chat("Hi"), chat(PROMPTS[2] + " Answer in detail, with examples from everyday life.")
    expected = {"long": alone(long[0]["content"], 24), "other": alone(PROMPTS[4], 24)}
    short_length = smollm.count_prompt_tokens(short)
    assert min(smollm.count_prompt_tokens(p) for p in (long, chat(PROMPTS[4]))) > short_length + 3
    # The short row's fourth decoding step fails: no other row is ever at that position.
    fail_forward_when(
        smollm,
        monkeypatch,
        lambda kwargs: kwargs["input_ids"].shape[1] == 1 and bool((kwargs["position_ids"] == short_length + 3).any()),
    )
    store = batched_engine.store
    for name, prompt in (("long", long), ("short", short), ("other", chat(PROMPTS[4]))):
        batched_engine.submit(Job(name, prompt, greedy(24)))

    failed = wait_for_terminal(store, "short", timeout=120)
    assert failed[-1].type == "error"
    assert failed[-1].data["message"] == failure_message("short")
    assert "forward failed for a poisoned row" in caplog.text  # for the log only
    assert any(e.type == "token" for e in failed)  # what it made before its step failed was sent
    assert streamed_text(store, "long")[0] == expected["long"]
    assert streamed_text(store, "other")[0] == expected["other"]


def test_a_decoding_thread_that_dies_ends_every_job_and_the_engine_stops_saying_ready(monkeypatch, caplog):
    """What a poisoned CUDA stream did (the next failed step's empty_cache() raised in the
    batch thread): here a step and then the batch's own clean-up fail."""
    from inference.batching import SyntheticBatch

    both_submitted = threading.Event()

    def step_fails(self):
        both_submitted.wait(5)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def cleanup_fails(self):
        raise RuntimeError("empty_cache: operation not permitted when stream is capturing")

    store = InMemoryStreamStore()
    engine = Engine(lambda: SyntheticGenerator(tokens_per_s=50), store, max_concurrent=1, max_queue=4)
    engine.start()
    assert engine.wait_ready(timeout=10)
    monkeypatch.setattr(SyntheticBatch, "step", step_fails)
    monkeypatch.setattr(SyntheticBatch, "cancel_all", cleanup_fails)
    engine.submit(Job("running", chat("hi")))
    engine.submit(Job("waiting", chat("hi")))
    both_submitted.set()
    for name in ("running", "waiting"):
        events = wait_for_terminal(store, name, timeout=10)
        assert events[-1].type == "error"
        assert events[-1].data["message"] == failure_message(name)
    assert not engine.ready
    assert "the decoding thread stopped: RuntimeError" in (engine.load_error or "")
    with pytest.raises(EngineOverloaded, match="can't serve"):
        engine.submit(Job("later", chat("hi")))
    assert not store.exists("later")
    assert "serves nothing more" in caplog.text
    engine.stop(5)
