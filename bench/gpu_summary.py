"""The results of a bench/gpu.sh run: its steps file, and the table, goals and checks read from it.

    python -m bench.gpu_summary DIR

bench/gpu.sh appends one JSON line per step to DIR/gpu-steps.jsonl as the step ends (a
server started, its answers, its warm-up, each concurrency level, a step skipped at the
deadline), so a run cut short still leaves what it finished. This prints each system's
tokens/s, first-token p50 and errors per level, then the GPU goals of docs/benchmarks.md
and the run's checks (answers, CUDA-graph captures, warm-ups, steps), each met, missed
or not measured.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

STEPS_FILE = "gpu-steps.jsonl"

SYSTEMS = {
    "graphs": "chatsite, GENERATION_CUDA_GRAPHS=1",
    "eager": "chatsite, GENERATION_CUDA_GRAPHS=0",
    "peer": "transformers serve --continuous-batching",
}

# inference/batching.py's log lines: StaticBatch.capture_all, StaticBatch._graph, open_batch.
CAPTURED = re.compile(r"Captured (\d+) CUDA graphs in ([\d.]+) s \((\d+) shapes failed")
CAPTURE_FAILED = "CUDA graph capture failed for"
STATIC_SLOTS = re.compile(r"Static decoding: (\d+) slots of (\d+) tokens")
NO_GRAPHS = re.compile(r"GENERATION_CUDA_GRAPHS=\S+ (?:on \S+: static decoding without graphs|: .*dynamic path)")

Step = dict[str, Any]


def append_step(path: Path, step: Step) -> None:
    """One step's result as a line of the steps file, written as soon as the step ends."""
    with path.open("a") as steps:
        steps.write(json.dumps(step) + "\n")


def read_steps(path: Path) -> list[Step]:
    """The steps written so far; a last line cut off by a killed run is left out."""
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            steps.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return steps


def capture_counts(log: str) -> dict[str, Any]:
    """What a chatsite server's log says of its CUDA graphs: shapes captured at start-up,
    how many failed then and in all (a shape first met while serving is captured then),
    and the static slots; or why there were none."""
    slots = STATIC_SLOTS.search(log)
    counts: dict[str, Any] = {"slots": int(slots.group(1)) if slots else None}
    if captured := CAPTURED.search(log):
        return {
            **counts,
            "graphs": True,
            "captured": int(captured.group(1)),
            "capture_s": float(captured.group(2)),
            "failed_at_start": int(captured.group(3)),
            "failed": log.count(CAPTURE_FAILED),
        }
    why = NO_GRAPHS.search(log)
    return {**counts, "graphs": False, "why": why.group(0) if why else "no capture logged"}


def _last(steps: list[Step], system: str, name: str) -> Step | None:
    found = [step for step in steps if step.get("system") == system and step.get("step") == name]
    return found[-1] if found else None


def levels(steps: list[Step]) -> dict[str, dict[int, Step]]:
    """Each system's level steps, by concurrency (the last one of each, if repeated)."""
    runs: dict[str, dict[int, Step]] = {}
    for step in steps:
        if step.get("step") == "level" and step.get("system") in SYSTEMS:
            runs.setdefault(step["system"], {})[step["level"]] = step
    return runs


def table(runs: dict[str, dict[int, Step]]) -> list[str]:
    lines = [f"{'system':<42}{'level':>6}{'status':>9}{'tok/s':>10}{'TTFT p50':>10}{'errors':>8}{'unfinished':>11}"]
    for system in SYSTEMS:
        for concurrency, step in sorted(runs.get(system, {}).items()):
            result = step.get("result") or {}
            rate = result.get("agg_tokens_per_s")
            ttft = result.get("ttft_median_s")
            lines.append(
                f"{SYSTEMS[system]:<42}{concurrency:>6}{step['status']:>9}"
                f"{'-' if rate is None else f'{rate:.1f}':>10}{'-' if ttft is None else f'{ttft:.3f}':>10}"
                f"{result.get('errors', '-'):>8}{result.get('unfinished', '-'):>11}"
            )
    return lines


def verdict(name: str, value: bool | None, detail: str, state: str | None = None) -> str:
    state = state or ("not measured" if value is None else "met" if value else "MISSED")
    return f"{state:>12}  {name}: {detail}"


def _unmeasured(step: Step | None) -> str | None:
    """Why a level gives no figure: absent, skipped or cut at the deadline, or it failed."""
    if step is None:
        return "not run"
    if step["status"] in ("skipped", "cut"):
        return f"{step['status']}: {step.get('reason', '')}".rstrip(": ")
    return None


def _failed(step: Step) -> str | None:
    """Why a level that ran failed as a whole (it ran out of its time, or broke)."""
    if step["status"] == "ok":
        return None
    return f"{step['status']}: {step.get('reason', '')}".rstrip(": ")


def goals(runs: dict[str, dict[int, Step]]) -> list[str]:
    """The goals on an H200 (issues #18, #37), checked on chatsite with CUDA graphs."""
    ours, peer = runs.get("graphs", {}), runs.get("peer", {})
    return [
        *(_level_goal(ours.get(level), f"no errors at {level} streams", _no_errors) for level in (256, 512)),
        _level_goal(ours.get(1), "one stream >= 150 tok/s", _one_stream),
        _ratio_goal(ours.get(256), peer.get(256)),
        _level_goal(ours.get(256), "first-token p50 at 256 <= 1 s", _first_token),
    ]


def _no_errors(result: dict[str, Any]) -> tuple[bool, str]:
    errors, unfinished = result["errors"], result.get("unfinished", 0)
    return errors == unfinished == 0, f"{errors} errors, {unfinished} unfinished of {result['requests'] + unfinished}"


def _one_stream(result: dict[str, Any]) -> tuple[bool, str]:
    return result["agg_tokens_per_s"] >= 150, f"{result['agg_tokens_per_s']:.1f} tok/s"


def _first_token(result: dict[str, Any]) -> tuple[bool, str]:
    ttft = result["ttft_median_s"]
    return ttft is not None and ttft <= 1.0, "no first token" if ttft is None else f"{ttft:.3f} s"


def _level_goal(step: Step | None, name: str, judge: Callable[[dict[str, Any]], tuple[bool, str]]) -> str:
    """A goal on one level: not measured where the level did not run (or was cut at the
    deadline); missed where it ran out of its own time or broke; else what `judge` says."""
    if why := _unmeasured(step):
        return verdict(name, None, why)
    assert step is not None
    if failed := _failed(step):
        return verdict(name, False, failed)
    met, detail = judge(step["result"])
    return verdict(name, met, detail)


def _ratio_goal(mine: Step | None, theirs: Step | None) -> str:
    name = "256 streams >= 3x transformers serve"
    if why := _unmeasured(mine):
        return verdict(name, None, f"chatsite {why}")
    assert mine is not None
    if failed := _failed(mine):
        return verdict(name, False, f"chatsite {failed}")
    if why := _unmeasured(theirs) or (_failed(theirs) if theirs else None):
        return verdict(name, None, f"transformers serve {why}")
    assert theirs is not None
    rate, peer_rate = mine["result"]["agg_tokens_per_s"], theirs["result"]["agg_tokens_per_s"]
    ratio = f" ({rate / peer_rate:.2f}x)" if peer_rate else ""
    return verdict(name, rate >= 3 * peer_rate, f"{rate:.1f} vs {peer_rate:.1f} tok/s{ratio}")


def answers_check(steps: list[Step]) -> list[str]:
    """The static path with graphs against the dynamic path, eager: the same greedy
    prompts, one at a time, in the run's dtype. Equal texts are required in float32; in a
    16-bit dtype the two paths round differently (issue #37), so a difference is reported
    with where it starts, not counted as a failure, unless an answer is empty or failed."""
    graphs, eager = _last(steps, "graphs", "answers"), _last(steps, "eager", "answers")
    name = "answers: graphs = eager"
    if graphs is None or eager is None:
        return [verdict(name, None, f"no answers from {'graphs' if graphs is None else 'eager'}")]
    lines = []
    failed = [
        f"{step['system']} prompt {answer['prompt']}: {answer.get('error') or 'empty'}"
        for step in (graphs, eager)
        for answer in step.get("answers", [])
        if answer.get("error") or not answer.get("text")
    ]
    if step_error := graphs.get("error") or eager.get("error"):
        failed.append(str(step_error))
    pairs = list(zip(graphs.get("answers", []), eager.get("answers", []), strict=False))
    same = sum(a["text"] == b["text"] for a, b in pairs)
    scope = f"first {graphs.get('max_tokens')} tokens, greedy, {graphs.get('dtype')}"
    if failed or not pairs:
        lines.append(verdict(name, False, "; ".join(failed[:3]) or "no answers"))
    elif same == len(pairs):
        lines.append(verdict(name, True, f"{same} of {len(pairs)} identical ({scope})"))
    else:
        prefixes = [_common_prefix(a["text"], b["text"]) for a, b in pairs if a["text"] != b["text"]]
        detail = f"{same} of {len(pairs)} identical ({scope}); the others agree on their first {min(prefixes)}+ chars"
        sixteen_bit = graphs.get("dtype") in ("bfloat16", "float16")
        lines.append(verdict(name, False, detail, state="differs" if sixteen_bit else None))
    peer = _last(steps, "peer", "answers")
    if peer and peer.get("answers"):
        agree = sum(a["text"] == b["text"] for a, b in zip(graphs.get("answers", []), peer["answers"], strict=False))
        lines.append(verdict("answers: graphs = transformers serve", None, f"{agree} of {len(pairs)}", state="info"))
    return lines


def _common_prefix(first: str, second: str) -> int:
    length = 0
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        length += 1
    return length


def capture_check(steps: list[Step]) -> list[str]:
    """The graphs server's CUDA graphs: every shape captured at start-up, none failed since."""
    name = "CUDA graphs captured, none failed"
    capture = _last(steps, "graphs", "capture")
    if capture is None:
        return [verdict(name, None, "no graphs server log read")]
    if not capture.get("graphs"):
        return [verdict(name, None, f"no graphs: {capture.get('why')}")]
    failed = capture["failed"]
    detail = (
        f"{capture['captured']} captured in {capture['capture_s']:.1f} s, {capture['failed_at_start']} failed at "
        f"start-up, {failed - capture['failed_at_start']} while serving; {capture.get('slots')} slots"
    )
    return [verdict(name, capture["captured"] > 0 and failed == 0, detail)]


def warmup_check(steps: list[Step]) -> list[str]:
    """Each system's warm-up: an error there is kept, and its levels were measured anyway."""
    lines = []
    for system in SYSTEMS:
        step = _last(steps, system, "warmup")
        if step is None:
            continue
        detail = step.get("reason") or f"{step.get('result', {}).get('errors', 0)} errors"
        lines.append(verdict(f"warm-up of {system}", step["status"] == "ok", detail))
    return lines


def server_errors(steps: list[Step]) -> list[str]:
    """Tracebacks and logged errors in each server's log (bench.gpu.sh records them at its end)."""
    lines = []
    for system in SYSTEMS:
        step = _last(steps, system, "server")
        if step is None:
            continue
        errors = step.get("errors", {})
        first = next(iter(errors), "")
        detail = f"{step.get('tracebacks', 0)} tracebacks, {sum(errors.values())} errors" + (
            f" (most: {first[:120]})" if first else ""
        )
        lines.append(verdict(f"server log of {system}", None, detail, state="info"))
    return lines


def step_counts(steps: list[Step]) -> list[str]:
    """Steps by status, and each one that did not end well, with why."""
    counts: dict[str, int] = {}
    for step in steps:
        counts[step.get("status", "?")] = counts.get(step.get("status", "?"), 0) + 1
    lines = ["steps: " + ", ".join(f"{count} {status}" for status, count in sorted(counts.items()))]
    for step in steps:
        if step.get("status") not in ("ok", None):
            where = " ".join(str(step[key]) for key in ("system", "step", "level") if step.get(key) is not None)
            lines.append(f"  {where}: {step['status']}: {str(step.get('reason', ''))[:200]}")
    return lines


def summary(steps: list[Step]) -> list[str]:
    runs = levels(steps)
    return [
        *table(runs),
        "",
        "Goals (H200):",
        *goals(runs),
        "",
        "Checks:",
        *answers_check(steps),
        *capture_check(steps),
        *warmup_check(steps),
        *server_errors(steps),
        "",
        *step_counts(steps),
    ]


def main() -> None:
    directory = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results/gpu")
    print("\n".join(summary(read_steps(directory / STEPS_FILE))))


if __name__ == "__main__":
    main()
