"""A moderation service on an answer as it streams, in plain Python: pieces sent at sentence
ends, nothing let out before it is judged, a block or a flag, a slow or absent service."""

from __future__ import annotations

import time

import pytest

from guardrails.matching import BLOCK, FLAG, MASK, MODERATION, WORDS, AnswerGuard, RuleSpec, TextPolicy
from guardrails.moderation import PIECE_MAX, AnswerModeration, piece_end
from tests.guardrails.moderation_server import SLOW_S, ModerationHandler

SENTENCES = [
    "The first sentence is harmless. ",
    "The second one carries a forbidden word. ",
    "The third is fine again.\n",
    "And a last line without an end",
]
TEXT = "".join(SENTENCES)


def judge(url: str, action: str = BLOCK, **fields) -> RuleSpec:
    return RuleSpec(7, "moderation", MODERATION, f"{url}/v1/moderations", action, "Refused by moderation.", **fields)


def guard_of(*rules: RuleSpec) -> AnswerGuard:
    judges = [rule for rule in rules if rule.matcher == MODERATION]
    return AnswerGuard(TextPolicy(rules), moderation=AnswerModeration(judges))


def words(text: str) -> list[str]:
    """The text as a model streams it: a word at a time, each with the space before it."""
    pieces: list[str] = []
    for word in text.split(" "):
        pieces.append(word if not pieces else " " + word)
    return pieces


def streamed(guard: AnswerGuard, pieces: list[str]) -> str:
    return "".join(guard.feed(piece) for piece in pieces) + guard.flush()


@pytest.mark.parametrize(
    ("flag_word", "action", "expected", "excerpts"),
    [
        ("nothing flags", BLOCK, TEXT, []),
        ("forbidden", BLOCK, SENTENCES[0] + "\n\nRefused by moderation.", [SENTENCES[1]]),
        ("harmless", BLOCK, "Refused by moderation.", [SENTENCES[0]]),
        ("without an end", BLOCK, "".join(SENTENCES[:3]) + "\n\nRefused by moderation.", [SENTENCES[3]]),
        ("forbidden", FLAG, TEXT, [SENTENCES[1]]),
    ],
)
def test_an_answer_is_judged_sentence_by_sentence(moderation, flag_word, action, expected, excerpts):
    ModerationHandler.flag_word = flag_word
    guard = guard_of(judge(moderation, action))

    assert streamed(guard, words(TEXT)) == expected
    assert [hit.text for hit in guard.hits] == excerpts
    assert guard.blocked == (action == BLOCK and bool(excerpts))


def test_the_service_is_sent_each_sentence_once(moderation):
    streamed(guard_of(judge(moderation, FLAG)), words(TEXT))

    assert sorted(seen["body"]["input"] for seen in ModerationHandler.seen) == sorted(SENTENCES)


def test_nothing_goes_out_before_the_service_judged_it(moderation):
    guard = guard_of(judge(f"{moderation}/gated", FLAG, timeout_s=10))

    held = [guard.feed(piece) for piece in words(TEXT)]
    ModerationHandler.gate.set()  # the service answers now
    deadline = time.monotonic() + 5
    released = ""
    while "\n" not in released and time.monotonic() < deadline:
        time.sleep(0.01)
        released += guard.feed("")

    assert held == [""] * len(held)
    assert released == "".join(SENTENCES[:3])  # the three sentences judged, in order; the last line unsent
    assert released + guard.flush() == TEXT


def test_the_unjudged_tail_alone_waits(moderation):
    guard = guard_of(judge(moderation, FLAG))
    out = ""
    for piece in words(TEXT):
        out += guard.feed(piece)
        time.sleep(0.02)  # a model's gap between tokens: a sentence's verdict comes within it

    assert out.startswith(SENTENCES[0] + SENTENCES[1])  # judged while the rest was written
    assert out + guard.flush() == TEXT


def test_a_masked_word_reaches_the_service_masked(moderation):
    mask = RuleSpec(1, "no names", WORDS, "forbidden", MASK, "[word]")

    text = streamed(guard_of(mask, judge(moderation, BLOCK)), words(TEXT))

    assert text == TEXT.replace("forbidden", "[word]")
    assert all("forbidden" not in seen["body"]["input"] for seen in ModerationHandler.seen)


def test_a_text_rules_block_ends_the_answer_after_what_the_service_judged(moderation):
    stop = RuleSpec(1, "no thirds", WORDS, "third", BLOCK, "Stopped.")
    guard = guard_of(stop, judge(moderation, FLAG))

    text = streamed(guard, words(TEXT))

    assert text == SENTENCES[0] + SENTENCES[1] + "The \n\nStopped."
    assert [hit.rule.name for hit in guard.hits] == ["no thirds", "moderation"]


def test_the_services_block_wins_over_a_later_text_rules_block(moderation):
    stop = RuleSpec(1, "no thirds", WORDS, "third", BLOCK, "Stopped.")
    guard = guard_of(stop, judge(moderation, BLOCK))

    text = streamed(guard, words(TEXT))

    assert text == SENTENCES[0] + "\n\nRefused by moderation."
    assert guard.blocked_by is not None and guard.blocked_by.rule.name == "moderation"
    assert [hit.rule.name for hit in guard.hits] == ["moderation"]  # the later match was never reached


@pytest.mark.parametrize(
    ("path", "fail_open", "expected"),
    [
        ("/slow", True, TEXT),
        ("/slow", False, "Refused by moderation."),
        ("/nonsense", True, TEXT),
        ("/nonsense", False, "Refused by moderation."),
    ],
)
def test_a_slow_or_broken_service_costs_its_timeout_and_fails_as_its_rule_says(moderation, path, fail_open, expected):
    guard = guard_of(judge(f"{moderation}{path}", BLOCK, timeout_s=0.3, fail_open=fail_open))

    started = time.monotonic()
    text = streamed(guard, words(TEXT))

    assert text == expected
    assert time.monotonic() - started < SLOW_S


@pytest.mark.parametrize(("fail_open", "expected"), [(True, TEXT), (False, "Refused by moderation.")])
def test_a_service_that_is_down_allows_or_blocks_as_its_rule_says(down_url, fail_open, expected):
    rule = RuleSpec(7, "moderation", MODERATION, down_url, BLOCK, "Refused by moderation.", fail_open=fail_open)

    assert streamed(guard_of(rule), words(TEXT)) == expected


@pytest.mark.parametrize(
    ("text", "end"),
    [
        ("Too short. ", 0),  # a list's "1. " is no sentence of its own
        ("A sentence long enough to go. And more", len("A sentence long enough to go. ")),
        ("A line long enough to go out\nnext", len("A line long enough to go out\n")),
        ("Pi is 3.14159 and no sentence ends here", 0),
        ("word " * 100, PIECE_MAX),
        ("x" * (PIECE_MAX + 10), PIECE_MAX),
    ],
)
def test_pieces_end_at_sentences_and_lines_and_are_bounded(text, end):
    assert piece_end(text) == end
