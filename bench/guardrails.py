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

    python -m bench.guardrails --moderation [--tokens 600] [--gap-ms 20] [--service-ms 0]

A moderation service on the answer (issue 36): a local HTTP server in OpenAI's
/v1/moderations shape (keep-alive, answering after --service-ms), judging the answer a
sentence at a time while tokens are fed every --gap-ms (a model at 1000/gap tokens/s).
Reported: each feed's own time (it never waits on the service), how long each token's
text is held before it goes out (p50/p99; without moderation: the text rules' hold-back
alone, near zero), the delay of the first visible text, the wait for the last piece's
verdict at the end, and the requests made. Results: bench/results/guardrails-moderation.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from bench import result_files
from guardrails.matching import (
    BLOCK,
    FLAG,
    MASK,
    MODERATION,
    PII,
    REGEX,
    WORDS,
    AnswerGuard,
    RuleSpec,
    TextPolicy,
)
from guardrails.moderation import AnswerModeration
from inference.generators import SYNTHETIC_TEXT

RESULTS = Path(__file__).parent / "results" / "guardrails.json"
MODERATION_RESULTS = Path(__file__).parent / "results" / "guardrails-moderation.json"
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


class _Moderation(BaseHTTPRequestHandler):
    """OpenAI's /v1/moderations shape, flagging nothing, after `delay_s`; connections kept alive."""

    protocol_version = "HTTP/1.1"
    delay_s = 0.0
    requests = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).requests += 1
        time.sleep(self.delay_s)
        body = json.dumps({"id": "modr-bench", "results": [{"flagged": False, "categories": {}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def moderation_timed(pieces: list[str], rules: list[RuleSpec], gap_s: float) -> dict[str, object]:
    """Feed `pieces` every `gap_s`: each feed's time, and how long each token's text waited."""
    judges = [rule for rule in rules if rule.matcher == MODERATION]
    guard = AnswerGuard(TextPolicy(rules), moderation=AnswerModeration(judges) if judges else None)
    fed_at: list[tuple[int, float]] = []  # (end of the token in the text, when it was fed)
    released_at: list[tuple[int, float]] = []  # (end of the text out so far, when)
    feeds: list[int] = []
    fed = out = 0
    began = time.monotonic()
    for piece in pieces:
        started = time.perf_counter_ns()
        text = guard.feed(piece)
        feeds.append(time.perf_counter_ns() - started)
        now = time.monotonic()
        fed += len(piece)
        fed_at.append((fed, now))
        if text:
            out += len(text)
            released_at.append((out, now))
        time.sleep(gap_s)
    flushing = time.monotonic()
    last = guard.flush()
    flushed = time.monotonic()
    if last:
        released_at.append((out + len(last), flushed))
    waits, at = [], 0
    for end, when in fed_at:  # a token is out once the text out reaches its end
        while released_at[at][0] < end:
            at += 1
        waits.append(released_at[at][1] - when)
    return {
        "feed_p50_us": round(percentile(feeds, 0.5) / 1000, 2),
        "feed_p99_us": round(percentile(feeds, 0.99) / 1000, 2),
        "held_p50_ms": round(percentile(waits, 0.5) * 1000, 1),
        "held_p99_ms": round(percentile(waits, 0.99) * 1000, 1),
        "first_visible_ms": round((released_at[0][1] - began) * 1000, 1),
        "final_wait_ms": round((flushed - flushing) * 1000, 2),
    }


def moderation_main(args: argparse.Namespace) -> None:
    _Moderation.delay_s = args.service_ms / 1000
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Moderation)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/moderations"
    judge = RuleSpec(9, "moderation", MODERATION, url, BLOCK, "No.", timeout_s=2.0)
    pieces = tokens(args.tokens)
    rows = {}
    # No text rules here: a mask changes the text's length, and each token's wait is found by
    # where its text ends (their own cost and hold-back are the other run's).
    for label, rules in (("no rules", []), ("moderation", [judge])):
        _Moderation.requests = 0
        rows[label] = {**moderation_timed(pieces, rules, args.gap_ms / 1000), "requests": _Moderation.requests}
    server.shutdown()
    summary = {
        "tokens": args.tokens,
        "gap_ms": args.gap_ms,
        "service_ms": args.service_ms,
        "answer_chars": sum(len(piece) for piece in pieces),
        "results": rows,
    }
    result_files.write(MODERATION_RESULTS, summary)
    for label, row in rows.items():
        print(f"{label:>16}: {row}")


def percentile(values: list[int] | list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=None, help="default: 20000, or 600 with --moderation")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--moderation", action="store_true", help="a moderation service on the answer")
    parser.add_argument("--gap-ms", type=float, default=20.0, help="with --moderation: the time between tokens")
    parser.add_argument("--service-ms", type=float, default=0.0, help="with --moderation: the service's delay")
    args = parser.parse_args()
    args.tokens = args.tokens or (600 if args.moderation else 20_000)
    if args.moderation:
        moderation_main(args)
        return
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
