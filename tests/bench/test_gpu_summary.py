"""bench/gpu_summary.py: the goals and checks of a bench/gpu.sh run, read from its steps file."""

from __future__ import annotations

from typing import Any

from bench.gpu_summary import append_step, capture_counts, read_steps, summary

GRAPHS_LOG = """\
INFO Static decoding: 256 slots of 4096 tokens (23040 MiB of keys and values), CUDA graphs on
WARNING CUDA graph capture failed for 128 rows x 4096 columns; decoding them eagerly
Traceback (most recent call last):
RuntimeError: out of memory
INFO Captured 62 CUDA graphs in 7.5 s (1 shapes failed and decode eagerly)
WARNING CUDA graph capture failed for 3 rows x 64 columns; decoding them eagerly
"""


def level(
    system: str, concurrency: int, rate: float, *, status: str = "ok", reason: str = "", **result: Any
) -> dict[str, Any]:
    figures = {"requests": 2 * concurrency, "errors": 0, "unfinished": 0, "ttft_median_s": 0.4, **result}
    return {
        "system": system,
        "step": "level",
        "level": concurrency,
        "status": status,
        "reason": reason,
        "result": {"agg_tokens_per_s": rate, **figures},
    }


def answers(system: str, texts: list[str], dtype: str = "bfloat16") -> dict[str, Any]:
    found = [{"prompt": i, "text": text, "completion_tokens": 32, "error": None} for i, text in enumerate(texts)]
    return {"system": system, "step": "answers", "status": "ok", "answers": found, "max_tokens": 32, "dtype": dtype}


def line(lines: list[str], name: str) -> str:
    return next(text for text in lines if f"  {name}:" in text)


def test_capture_counts_reads_the_graphs_captured_and_every_failed_capture():
    counts = capture_counts(GRAPHS_LOG)

    assert counts == {
        "slots": 256,
        "graphs": True,
        "captured": 62,
        "capture_s": 7.5,
        "failed_at_start": 1,
        "failed": 2,  # the one at start-up and one first met while serving
    }


def test_capture_counts_says_why_there_are_no_graphs():
    counts = capture_counts("WARNING GENERATION_CUDA_GRAPHS=1 on cpu: static decoding without graphs\n")

    assert counts["graphs"] is False
    assert counts["why"] == "GENERATION_CUDA_GRAPHS=1 on cpu: static decoding without graphs"


def test_a_step_cut_off_mid_line_by_a_killed_run_is_left_out(tmp_path):
    path = tmp_path / "gpu-steps.jsonl"
    append_step(path, level("graphs", 1, 180.0))
    with path.open("a") as steps:
        steps.write('{"system": "graphs", "step": "lev')

    assert read_steps(path) == [level("graphs", 1, 180.0)]


def test_goals_met_missed_and_not_measured_from_the_levels():
    steps = [
        level("graphs", 1, 180.0),
        level("graphs", 256, 9000.0, ttft_median_s=1.4),
        level("graphs", 512, 9500.0, errors=3),
        level("peer", 256, 2000.0),
    ]

    lines = summary(steps)

    assert line(lines, "no errors at 256 streams").split()[0] == "met"
    assert "MISSED  no errors at 512 streams: 3 errors, 0 unfinished of 1024" in line(lines, "no errors at 512 streams")
    assert line(lines, "one stream >= 150 tok/s").split()[0] == "met"
    assert "met  256 streams >= 3x transformers serve: 9000.0 vs 2000.0 tok/s (4.50x)" in line(
        lines, "256 streams >= 3x transformers serve"
    )
    assert "MISSED  first-token p50 at 256 <= 1 s: 1.400 s" in line(lines, "first-token p50 at 256 <= 1 s")


def test_a_level_out_of_its_time_misses_its_goals_and_one_cut_at_the_deadline_is_not_measured():
    steps = [
        level("graphs", 1, 20.0, status="timeout", reason="stopped at its limit of 90 s, 3 requests unfinished"),
        level("graphs", 256, 9000.0),
        {"system": "peer", "step": "level", "level": 256, "status": "skipped", "reason": "deadline: 4 s left"},
    ]

    lines = summary(steps)

    assert "MISSED  one stream >= 150 tok/s: timeout: stopped at its limit of 90 s" in line(
        lines, "one stream >= 150 tok/s"
    )
    assert "not measured  256 streams >= 3x transformers serve: transformers serve skipped: deadline: 4 s left" in line(
        lines, "256 streams >= 3x transformers serve"
    )
    assert "not measured  no errors at 512 streams: not run" in line(lines, "no errors at 512 streams")
    assert "steps: 1 ok, 1 skipped, 1 timeout" in lines


def test_answers_must_be_identical_in_float32():
    steps = [answers("graphs", ["Gears turn.", "Tides rise."], "float32")]
    steps.append(answers("eager", ["Gears turn.", "Tides fall."], "float32"))

    check = line(summary(steps), "answers: graphs = eager")

    assert check.split()[0] == "MISSED"
    assert "1 of 2 identical (first 32 tokens, greedy, float32); the others agree on their first 6+ chars" in check


def test_answers_that_differ_in_bfloat16_are_shown_as_differing_not_missed():
    steps = [answers("graphs", ["Gears turn.", "Tides rise."]), answers("eager", ["Gears turn.", "Tides fall."])]

    check = line(summary(steps), "answers: graphs = eager")

    assert check.split()[0] == "differs"


def test_an_empty_answer_misses_the_answers_check_in_any_dtype():
    steps = [answers("graphs", ["Gears turn.", ""]), answers("eager", ["Gears turn.", "Tides fall."])]

    check = line(summary(steps), "answers: graphs = eager")

    assert check.split()[0] == "MISSED"
    assert "graphs prompt 1: empty" in check


def test_identical_answers_and_clean_captures_are_met():
    capture = {"system": "graphs", "step": "capture", "status": "ok", **capture_counts(GRAPHS_LOG)}
    clean = {**capture, "failed": 0, "failed_at_start": 0}
    steps = [answers("graphs", ["Gears turn."]), answers("eager", ["Gears turn."]), capture]

    lines = summary(steps)
    assert line(lines, "answers: graphs = eager").split()[0] == "met"
    assert "MISSED  CUDA graphs captured, none failed: 62 captured in 7.5 s, 1 failed at start-up, 1 while serving" in (
        line(lines, "CUDA graphs captured, none failed")
    )
    assert line(summary([*steps, clean]), "CUDA graphs captured, none failed").split()[0] == "met"


def test_a_failed_warm_up_is_reported_and_the_levels_after_it_still_count():
    warmup = {"system": "graphs", "step": "warmup", "status": "error", "level": 512, "reason": "HTTP 503: queue full"}
    steps = [warmup, level("graphs", 1, 200.0)]

    lines = summary(steps)

    assert "MISSED  warm-up of graphs: HTTP 503: queue full" in line(lines, "warm-up of graphs")
    assert line(lines, "one stream >= 150 tok/s").split()[0] == "met"
