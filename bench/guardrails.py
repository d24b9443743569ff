"""What answer rules add to each streamed token: the content policy's matcher, timed alone.

    python -m bench.guardrails [--tokens 20000] [--runs 5]

An answer of `--tokens` synthetic word tokens (the synthetic model's text, cycled) is fed
one token at a time to an AnswerGuard with five active rules (personal data of all four
kinds masked, a 50-word list masked, a regular expression masked, a word list that blocks
and never matches, a regular expression that flags), and to none. Each token's `feed`
call is timed with perf_counter_ns; the figure is the added time per token, p50 and p99,
against the goal of 5 ms p50 (issue 36). It also reports the hold-back: how many tokens
the first visible text waits for (what the rules add to the time to first token, in
tokens; multiply by the model's inter-token gap), also for the three rules of the five
that are no regular expression ("no regex": those hold back only what could begin a
match). Results: bench/results/guardrails.json.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from pathlib import Path

from bench import result_files
from guardrails.matching import BLOCK, FLAG, MASK, PII, REGEX, WORDS, AnswerGuard, RuleSpec, TextPolicy
from inference.generators import SYNTHETIC_TEXT

RESULTS = Path(__file__).parent / "results" / "guardrails.json"
GOAL_P50_MS = 5.0

FIVE_RULES = [
    RuleSpec(1, "personal data", PII, "email, phone, iban, card", MASK),
    RuleSpec(2, "word list", WORDS, "\n".join(f"forbiddenword{n}" for n in range(49)) + "\npeople", MASK),
    RuleSpec(3, "ticket numbers", REGEX, r"\bTCK-\d{6}\b", MASK),
    RuleSpec(4, "launch codes", WORDS, "launch codes\nself-destruct sequence", BLOCK, "No."),
    RuleSpec(5, "project names", REGEX, r"Project [A-Z][a-z]+", FLAG),
]


def tokens(count: int) -> list[str]:
    words = itertools.cycle(SYNTHETIC_TEXT.split())
    return [("" if index == 0 else " ") + next(words) for index in range(count)]


def timed(pieces: list[str], rules: list[RuleSpec]) -> tuple[list[int], int]:
    """Each feed's nanoseconds, and the tokens fed before the first visible text."""
    guard = AnswerGuard(TextPolicy(rules))
    gaps: list[int] = []
    first_visible = -1
    for index, piece in enumerate(pieces):
        started = time.perf_counter_ns()
        out = guard.feed(piece)
        gaps.append(time.perf_counter_ns() - started)
        if out and first_visible < 0:
            first_visible = index + 1
    guard.flush()
    return gaps, first_visible


def percentile(values: list[int], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    pieces = tokens(args.tokens)
    rows = {}
    no_regex = [rule for rule in FIVE_RULES if rule.matcher != REGEX]
    for label, rules in (("none", []), ("five rules", FIVE_RULES), ("no regex", no_regex)):
        samples: list[int] = []
        first_visible = 0
        for _ in range(args.runs):
            gaps, first_visible = timed(pieces, rules)
            samples += gaps
        rows[label] = {
            "p50_us": round(percentile(samples, 0.5) / 1000, 2),
            "p99_us": round(percentile(samples, 0.99) / 1000, 2),
            "mean_us": round(statistics.fmean(samples) / 1000, 2),
            "first_visible_after_tokens": first_visible,
        }
    added_p50_ms = (rows["five rules"]["p50_us"] - rows["none"]["p50_us"]) / 1000
    summary = {
        "tokens": args.tokens,
        "runs": args.runs,
        "rules": [rule.name for rule in FIVE_RULES],
        "hold_back_chars": TextPolicy(FIVE_RULES).hold_back,
        "results": rows,
        "added_p50_ms": round(added_p50_ms, 4),
        "goal_p50_ms": GOAL_P50_MS,
        "meets_goal": added_p50_ms <= GOAL_P50_MS,
    }
    result_files.write(RESULTS, summary)
    for label, row in rows.items():
        print(
            f"{label:>10}: p50 {row['p50_us']} µs, p99 {row['p99_us']} µs per token; "
            f"first text after {row['first_visible_after_tokens']} tokens"
        )
    print(f"added per token (p50): {added_p50_ms:.4f} ms (goal ≤ {GOAL_P50_MS} ms)")


if __name__ == "__main__":
    main()
