"""Static-shape decoding (GENERATION_CUDA_GRAPHS): key/value slots, rows padded to buckets.

On a CPU the static path runs without CUDA graphs: the same slots, buckets and masks a
GPU replays, so what it answers here is what a captured step computes there."""

from __future__ import annotations

import contextlib
import logging
from types import SimpleNamespace

import pytest
import torch

from inference import batching
from inference import engine as engine_module
from inference.batching import (
    Sequence,
    SlotsDontFit,
    StaticBatch,
    TransformersBatch,
    capture,
    open_batch,
    row_bucket,
    slot_moves,
    slots_that_fit,
    static_shapes,
    static_unsupported,
)
from inference.engine import Job, failure_message
from inference.generators import ContextLengthExceeded, GenerationParams
from tests.support.engines import install_engine, wait_for_terminal, wait_until

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in two sentences. Use simple words.",
    "Hi",
    "Why is the sky blue?",
]


def chat(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def greedy(max_tokens: int) -> GenerationParams:
    return GenerationParams(max_tokens=max_tokens, temperature=0)


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


def static_batch(smollm, *, max_rows: int = 8, row_tokens: int = 256) -> StaticBatch:
    batch = open_batch(smollm, max_rows=max_rows, cuda_graphs="1", row_tokens=row_tokens)
    assert isinstance(batch, StaticBatch)
    assert not batch.cuda_graphs  # no CUDA here: eager
    return batch


def test_rows_are_padded_up_to_power_of_two_buckets():
    assert [row_bucket(n) for n in (1, 2, 3, 5, 8, 9, 200, 256)] == [1, 2, 4, 8, 8, 16, 256, 256]
    assert row_bucket(257) == 512
    assert row_bucket(512) == 512


def test_auto_keeps_the_dynamic_path_on_a_cpu_and_1_takes_the_static_one(smollm):
    assert type(open_batch(smollm, cuda_graphs="auto")) is TransformersBatch
    assert type(open_batch(smollm, cuda_graphs="0")) is TransformersBatch
    assert type(open_batch(smollm, cuda_graphs="1", max_rows=3, row_tokens=64)) is StaticBatch


def test_static_slots_answer_like_generate_as_rows_join_and_leave_at_different_steps(smollm, alone):
    """Rows of different prompt lengths join at steps 0, 3 and 5 and leave at different
    steps (one from the middle of the slots, so the rows after it move down): every
    greedy answer is the one generate() gives alone, in float32."""
    limits = {PROMPTS[0]: 12, PROMPTS[3]: 4, PROMPTS[1]: 12, PROMPTS[2]: 10, PROMPTS[4]: 6}
    expected = {prompt: alone(prompt, limit) for prompt, limit in limits.items()}
    joining_at = {0: PROMPTS[:1] + PROMPTS[3:4] + PROMPTS[4:5], 3: PROMPTS[1:2], 5: PROMPTS[2:3]}
    batch = static_batch(smollm)
    texts: dict[str, list[str]] = {prompt: [] for prompt in limits}
    left_at: dict[str, int] = {}
    step = 0
    while step == 0 or len(batch):
        for prompt in joining_at.get(step, []):
            batch.add(Sequence(chat(prompt), greedy(limits[prompt]), texts[prompt].append, lambda: False))
        for sequence, outcome in batch.step():
            assert not isinstance(outcome, Exception)
            left_at[sequence.prompt[0]["content"]] = step
        step += 1

    assert {prompt: "".join(pieces) for prompt, pieces in texts.items()} == expected
    assert left_at[PROMPTS[3]] < left_at[PROMPTS[4]] < left_at[PROMPTS[0]]  # "Hi" left from slot 1 of 3
    assert len(set(left_at.values())) >= 3


def test_a_prompt_longer_than_a_slot_is_refused_and_joins_nothing(smollm):
    batch = static_batch(smollm, row_tokens=40)
    long_prompt = chat("Tell me everything about the history of the Roman empire, in detail.")
    assert smollm.count_prompt_tokens(long_prompt) > 40
    with pytest.raises(ContextLengthExceeded, match="40 tokens"):
        batch.add(Sequence(long_prompt, greedy(8), lambda text: None, lambda: False))
    assert len(batch) == 0


def test_an_answer_ends_at_the_end_of_its_slot(smollm):
    prompt = chat(PROMPTS[2])
    prompt_tokens = smollm.count_prompt_tokens(prompt)
    batch = static_batch(smollm, row_tokens=prompt_tokens + 4)
    batch.add(Sequence(prompt, greedy(50), lambda text: None, lambda: False))
    finished = []
    while len(batch):
        finished += batch.step()
    [(_, outcome)] = finished
    assert (outcome.completion_tokens, outcome.finish_reason) == (4, "length")


@pytest.fixture(params=["0", "1"], ids=["dynamic", "static"])
def engine(request, stream_store, smollm):
    engine = install_engine(
        stream_store, smollm, scheduler="batched", max_concurrent=4, cuda_graphs=request.param, slot_tokens=256
    )
    yield engine
    engine.stop(timeout=60)


def test_the_engine_decodes_on_the_static_path_when_told(stream_store, smollm, alone):
    engine = install_engine(
        stream_store, smollm, scheduler="batched", max_concurrent=4, cuda_graphs="1", slot_tokens=256
    )
    try:
        for name, prompt in (("a", PROMPTS[0]), ("b", PROMPTS[4])):
            engine.submit(Job(name, chat(prompt), greedy(12)))
        for name, prompt in (("a", PROMPTS[0]), ("b", PROMPTS[4])):
            events = wait_for_terminal(stream_store, name, timeout=120)
            assert "".join(e.data["delta"] for e in events if e.type == "token") == alone(prompt, 12)
            assert events[-1].type == "done"
    finally:
        engine.stop(timeout=60)


def failing_steps(smollm, monkeypatch, error: Exception):
    """The model's decoding steps fail with `error` while the returned switch is on."""
    forward = smollm.model.forward
    switch = {"on": False}

    def faulty_forward(*args, **kwargs):
        if switch["on"] and kwargs["input_ids"].shape[1] == 1:
            raise error
        return forward(*args, **kwargs)

    monkeypatch.setattr(smollm.model, "forward", faulty_forward)
    return switch


@pytest.mark.parametrize(
    "error",
    [RuntimeError("a decoding step failed"), torch.OutOfMemoryError("CUDA out of memory")],
    ids=["error", "oom"],
)
def test_a_step_failing_for_every_row_ends_them_with_their_text_and_the_engine_goes_on(
    engine, smollm, alone, monkeypatch, caplog, error
):
    switch = failing_steps(smollm, monkeypatch, error)
    results = {}
    for name, prompt in (("a", PROMPTS[1]), ("b", PROMPTS[2])):
        engine.submit(
            Job(name, chat(prompt), greedy(40), on_finish=lambda result, name=name: results.update({name: result}))
        )
    store = engine.store
    # Both rows have streamed some tokens: now every step fails.
    wait_until(lambda: all(sum(e.type == "token" for e in store.events(n)) >= 3 for n in "ab"), timeout=120)
    switch["on"] = True
    with caplog.at_level(logging.ERROR):
        ended = {name: wait_for_terminal(store, name, timeout=120) for name in "ab"}
    switch["on"] = False

    for name, events in ended.items():
        streamed = "".join(e.data["delta"] for e in events if e.type == "token")
        assert events[-1].type == "error"
        assert events[-1].data["message"] == failure_message(name)
        assert streamed
        assert results[name].text == streamed
        assert results[name].status == "error"
    assert str(error) in caplog.text  # the cause is in the log, not in what clients see
    # The engine lives on: the next request is answered in full.
    engine.submit(Job("next", chat(PROMPTS[0]), greedy(12)))
    events = wait_for_terminal(store, "next", timeout=120)
    assert events[-1].type == "done"
    assert "".join(e.data["delta"] for e in events if e.type == "token") == alone(PROMPTS[0], 12)


def test_a_row_failing_alone_on_the_static_path_leaves_and_the_others_go_on(smollm, alone, monkeypatch):
    short, long = chat("Hi"), chat(PROMPTS[2])
    expected = alone(PROMPTS[2], 16)  # before the model is made faulty
    short_length = smollm.count_prompt_tokens(short)
    assert smollm.count_prompt_tokens(long) > short_length + 3
    forward = smollm.model.forward

    def faulty_forward(*args, **kwargs):  # any step holding the short row at its 4th token fails
        positions = kwargs.get("position_ids")  # none in the template prefix's own pass
        if kwargs["input_ids"].shape[1] == 1 and positions is not None and bool((positions == short_length + 3).any()):
            raise RuntimeError("forward failed for a poisoned row")
        return forward(*args, **kwargs)

    monkeypatch.setattr(smollm.model, "forward", faulty_forward)
    batch = static_batch(smollm)
    texts: dict[str, list[str]] = {"short": [], "long": []}
    sequences = {
        name: Sequence(prompt, greedy(16), texts[name].append, lambda: False)
        for name, prompt in (("short", short), ("long", long))
    }
    for sequence in sequences.values():
        batch.add(sequence)
    outcomes = {}
    while len(batch):
        outcomes.update(batch.step())

    assert isinstance(outcomes[sequences["short"]], RuntimeError)
    assert texts["short"]
    assert "".join(texts["long"]) == expected


def test_a_batch_that_cannot_be_set_up_fails_each_job_and_the_engine_says_why(stream_store, smollm, monkeypatch):
    def no_memory_for_slots(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 22.50 GiB")

    monkeypatch.setattr(engine_module, "open_batch", no_memory_for_slots)
    engine = install_engine(stream_store, smollm, scheduler="batched", max_concurrent=2, cuda_graphs="1")
    try:
        engine.submit(Job("a", chat("Hi"), greedy(4)))
        events = wait_for_terminal(stream_store, "a", timeout=60)
        assert events[-1].type == "error"
        assert events[-1].data["message"] == failure_message("a")
        assert "OutOfMemoryError" in (engine.load_error or "")
    finally:
        engine.stop(timeout=10)


def test_a_departure_moves_one_row_from_beyond_the_end_into_each_freed_slot():
    assert slot_moves([0, 1, 2, 3]) == []  # nobody left
    assert slot_moves([0, 1, 2]) == []  # the last row left: nothing moves
    assert slot_moves([1, 2, 3]) == [(3, 0)]  # the first left: the last takes its slot
    assert slot_moves(list(range(1, 256))) == [(255, 0)]  # one copy, not 254
    assert slot_moves([0, 2, 4, 5, 6]) == [(5, 1), (6, 3)]
    assert slot_moves([3]) == [(3, 0)]


def test_rows_leaving_from_the_front_keep_their_answers_after_their_slots_moved(smollm, alone):
    batch = static_batch(smollm, max_rows=4)
    answers = {}
    lengths = {PROMPTS[0]: 3, PROMPTS[1]: 12, PROMPTS[2]: 6, PROMPTS[4]: 12}
    for prompt, tokens in lengths.items():
        batch.add(
            Sequence(
                chat(prompt),
                greedy(tokens),
                lambda text, p=prompt: answers.setdefault(p, []).append(text),
                lambda: False,
            )
        )
    while len(batch):
        batch.step()
    for prompt, tokens in lengths.items():
        assert "".join(answers[prompt]) == alone(prompt, tokens)


GIB = 2**30
# An 8B model (Llama 3 8B): 32 layers, 8 key/value heads of 128, bfloat16.
SLOT_8B = 2 * 32 * 8 * 4096 * 128 * 2


def test_slots_are_sized_from_the_memory_free_once_and_never_past_it(caplog):
    assert SLOT_8B == GIB // 2  # 256 slots: 128 GiB, the figure no GPU holds
    assert slots_that_fit(256, SLOT_8B, 4096, None) == 256  # unknown: as configured
    assert slots_that_fit(256, SLOT_8B, 4096, 200 * GIB) == 256
    # An 80 GB card with 16 GB of weights: 62 GiB free, 80% of it for slots, 99 fit.
    with caplog.at_level(logging.WARNING, logger="inference.batching"):
        assert slots_that_fit(256, SLOT_8B, 4096, 62 * GIB) == 64
    assert "256 slots of 4096 tokens need 128.0 GiB" in caplog.text
    assert "at most 64 generations decode at once" in caplog.text
    with pytest.raises(SlotsDontFit, match=r"not even one fits in 0.2 GiB .*GENERATION_SLOT_TOKENS"):
        slots_that_fit(256, SLOT_8B, 4096, GIB // 4)


def test_the_engine_runs_no_more_rows_than_the_memory_free_holds_from_start_up(
    stream_store, smollm, alone, monkeypatch
):
    config = smollm.model.config
    slot = 2 * config.num_hidden_layers * config.num_key_value_heads * 256 * 64 * 4  # float32
    monkeypatch.setattr(batching, "available_memory", lambda device: int(2.5 * slot / batching.SLOT_MEMORY_SHARE))
    engine = install_engine(
        stream_store, smollm, scheduler="batched", max_concurrent=8, cuda_graphs="1", slot_tokens=256
    )
    try:
        wait_until(lambda: engine.max_concurrent == 2, timeout=60)  # sized before any job came
        for index in range(4):
            engine.submit(Job(f"s{index}", chat(PROMPTS[index]), greedy(6)))
        for index in range(4):
            events = wait_for_terminal(stream_store, f"s{index}", timeout=120)
            assert events[-1].type == "done"
            assert "".join(e.data["delta"] for e in events if e.type == "token") == alone(PROMPTS[index], 6)
    finally:
        engine.stop(timeout=10)


def test_every_step_shape_is_known_before_serving():
    assert static_shapes(8, 256) == [(rows, width) for rows in (1, 2, 4, 8) for width in (64, 128, 256)]
    assert len(static_shapes(256, 4096)) == 63  # 9 buckets by 7 widths
    assert static_shapes(2, 16) == [(1, 16), (2, 16)]
    assert static_shapes(512, 100)[-1] == (512, 100)


def test_bitsandbytes_8bit_weights_never_take_the_graph_path(smollm, monkeypatch):
    config = smollm.model.config
    monkeypatch.setattr(config, "quantization_config", {"load_in_8bit": True}, raising=False)
    assert "8-bit" in (static_unsupported(config) or "")
    assert type(open_batch(smollm, max_rows=4, cuda_graphs="1", row_tokens=64)) is TransformersBatch
    monkeypatch.setattr(config, "quantization_config", {"load_in_4bit": True}, raising=False)
    assert static_unsupported(config) is None


class _CaptureDevice:
    """torch's CUDA calls that capture() makes, recorded: the test double of a device
    whose capture fails as an invalidated one does (capture_end raises)."""

    def __init__(self, *, end_fails: bool) -> None:
        self.current = "default stream"
        self.calls: list[tuple] = []
        self.end_fails = end_fails
        self.cuda = SimpleNamespace(synchronize=lambda: None, stream=self._stream)
        self._C = SimpleNamespace(_cuda_endAllocateToPool=lambda *args: self.calls.append(("end_pool", *args)))

    @contextlib.contextmanager
    def _stream(self, stream):
        previous, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = previous

    def graph(self):
        device = self

        class Graph:
            def capture_begin(self, pool):
                device.calls.append(("begin", pool, device.current))

            def capture_end(self):
                device.calls.append(("end", device.current))
                if device.end_fails:
                    raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

            def pool(self):
                return "graph pool"

            def reset(self):
                device.calls.append(("reset",))

        return Graph()


CAPTURE_STREAM = SimpleNamespace(device=SimpleNamespace(index=0), name="capture stream")


def test_a_failed_capture_leaves_the_stream_and_the_allocator_as_they_were():
    device = _CaptureDevice(end_fails=True)
    with pytest.raises(RuntimeError, match="stream is capturing"):
        capture(device, device.graph(), "shared pool", CAPTURE_STREAM, lambda: "logits")
    assert device.current == "default stream"  # torch.cuda.graph leaves the capture stream current
    assert device.calls == [
        ("begin", "shared pool", CAPTURE_STREAM),
        ("end", CAPTURE_STREAM),
        ("end_pool", 0, "graph pool"),  # the allocator stops sending allocations to the pool
        ("reset",),
    ]


def test_a_step_failing_inside_a_capture_ends_the_capture_and_goes_on_as_its_error():
    device = _CaptureDevice(end_fails=False)

    def step():
        raise ValueError("a kernel the graph can't hold")

    with pytest.raises(ValueError, match="can't hold"):
        capture(device, device.graph(), None, CAPTURE_STREAM, step)
    assert device.current == "default stream"
    assert [call[0] for call in device.calls] == ["begin", "end"]
    device.calls.clear()
    assert capture(device, device.graph(), None, CAPTURE_STREAM, lambda: "logits") == "logits"
    assert device.current == "default stream"


def test_shapes_whose_capture_fails_decode_eagerly_and_are_counted(smollm, alone, monkeypatch):
    batch = static_batch(smollm, max_rows=2)
    batch.cuda_graphs = True  # as on CUDA; every capture fails

    def capture_fails(rows, width):
        raise RuntimeError("capture failed")

    monkeypatch.setattr(batch, "_capture", capture_fails)
    pieces: list[str] = []
    batch.add(Sequence(chat(PROMPTS[0]), greedy(8), pieces.append, lambda: False))
    while len(batch):
        batch.step()
    assert "".join(pieces) == alone(PROMPTS[0], 8)
    assert batch.failed_captures == 1  # one shape, tried once


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_a_replayed_graph_computes_what_the_eager_step_computes_on_the_same_inputs(smollm):
    """On a GPU: graphs against eager forward on identical inputs (greedy texts equal
    generate() only in float32, and the graphs run in the model's own dtype)."""
    from inference.generators import TransformersGenerator

    generator = TransformersGenerator("smollm-on-cuda", smollm.model.to("cuda"), smollm.tokenizer)
    try:
        batch = open_batch(generator, max_rows=4, cuda_graphs="1", row_tokens=256)
        assert isinstance(batch, StaticBatch) and batch.cuda_graphs and batch.failed_captures == 0
        for prompt in PROMPTS[:3]:
            batch.add(Sequence(chat(prompt), greedy(8), lambda text: None, lambda: False))
        batch.step()  # prefill
        with torch.inference_mode():
            count = len(batch._rows)
            padded = row_bucket(count)
            batch._ids[:padded, 0] = 7
            batch._lengths[:padded] = torch.tensor([row.cached for row in batch._rows] + [0] * (padded - count))
            width = batch._width()
            eager = batch._forward(slice(0, padded), width).clone()
            replayed = batch._replay(padded, width).clone()
        torch.testing.assert_close(replayed[:count], eager[:count])
    finally:
        smollm.model.to("cpu")


@pytest.mark.slow
# Compiling takes as long as the machine is slow: about 100 s on two cores of one, over
# the suite's 300 s on another (a fresh clone, 2026-12-07).
@pytest.mark.timeout(900)
def test_the_compiled_step_answers_like_generate_as_rows_join_leave_and_widen(smollm, alone, caplog):
    """GENERATION_COMPILE on a CPU: the same step through torch.compile (about 100 s of
    compiling on two cores, the cost the log states)."""
    try:
        with caplog.at_level(logging.INFO, logger="inference.batching"):
            batch = open_batch(smollm, max_rows=4, cuda_graphs="1", row_tokens=256, compiled=True)
        assert "Compiled the decoding step in" in caplog.text
        assert batch._step is not batch._forward
        answers: dict[str, list[str]] = {}
        lengths = {PROMPTS[0]: 40, PROMPTS[3]: 5, PROMPTS[4]: 40}  # past 64 columns: a wider step
        for prompt, tokens in lengths.items():
            batch.add(Sequence(chat(prompt), greedy(tokens), answers.setdefault(prompt, []).append, lambda: False))
            batch.step()
        while len(batch):
            batch.step()
        for prompt, tokens in lengths.items():
            assert "".join(answers[prompt]) == alone(prompt, tokens)
    finally:
        batching.forget_compiled_steps()
