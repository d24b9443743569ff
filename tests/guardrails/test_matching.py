"""The plain-Python matcher: whole texts, and the same texts streamed in any pieces."""

from __future__ import annotations

import random

import pytest

from guardrails.matching import (
    BLOCK,
    FLAG,
    MASK,
    PII,
    REGEX,
    WORDS,
    AnswerGuard,
    RuleSpec,
    TextPolicy,
    iban_valid,
    luhn_valid,
    validate_rule,
)

PII_MASK = RuleSpec(1, "personal data", PII, "", MASK)
WORD_MASK = RuleSpec(2, "fruit", WORDS, "banana\nsecret plan", MASK, "***")
CODES_BLOCK = RuleSpec(3, "launch codes", REGEX, r"launch codes?", BLOCK, "I cannot help with that.")
PROJECT_FLAG = RuleSpec(4, "project names", REGEX, r"Project [A-Z][a-z]+", FLAG)
RULES = [PII_MASK, WORD_MASK, CODES_BLOCK, PROJECT_FLAG]

# (text, what the rules make of it)
CASES = [
    ("Write to alice@example.com today.", "Write to [email] today."),
    ("Call +44 20 7946 0958 or (030) 1234 5678.", "Call [phone] or [phone]."),
    ("Card 4111 1111 1111 1111, not 4111 1111 1111 1112.", "Card [card], not 4111 1111 1111 1112."),
    ("IBAN GB82 WEST 1234 5698 7654 32 is mine", "IBAN [iban] is mine"),
    ("IBAN GB82WEST12345698765432.", "IBAN [iban]."),
    ("A Banana, bananas and the SECRET PLAN.", "A ***, bananas and the ***."),
    ("On 2024-01-15 we sold 12345678 units.", "On 2024-01-15 we sold 12345678 units."),
    ("Project Apollo used alice@example.com", "Project Apollo used [email]"),
    ("Here are the launch codes: 0000", "Here are the \n\nI cannot help with that."),
    ("banana", "***"),
    ("", ""),
]


def streamed(policy: TextPolicy, pieces: list[str]) -> str:
    guard = AnswerGuard(policy)
    return "".join(guard.feed(piece) for piece in pieces) + guard.flush()


def expected_stream(text: str) -> str:
    """A whole text's answer: as TextPolicy.apply, a block ending it with its message."""
    applied = TextPolicy(RULES).apply(text)
    if applied.blocked_by is None:
        return applied.text
    return applied.text + ("\n\n" if applied.text else "") + applied.blocked_by.rule.message


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_a_match_split_across_every_token_boundary_is_found_as_in_the_whole_text(text, expected):
    policy = TextPolicy(RULES)
    assert expected_stream(text) == expected
    for cut in range(1, len(text)):
        assert streamed(policy, [text[:cut], text[cut:]]) == expected, cut
    for first in range(1, len(text)):  # three pieces: every pair of boundaries
        for second in range(first + 1, len(text)):
            assert streamed(policy, [text[:first], text[first:second], text[second:]]) == expected


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_a_text_fed_one_character_at_a_time_comes_out_masked(text, expected):
    assert streamed(TextPolicy(RULES), list(text)) == expected


def test_masked_text_is_never_released_before_its_match_is_decided():
    guard = AnswerGuard(TextPolicy([PII_MASK]))
    released = ""
    for char in "Mail me at alice@example.com please, and thanks for all the fish in the sea!":
        released += guard.feed(char)
        assert "alice" not in released
    assert released + guard.flush() == "Mail me at [email] please, and thanks for all the fish in the sea!"


def test_a_word_list_holds_back_only_an_end_that_begins_one_of_its_words():
    guard = AnswerGuard(TextPolicy([WORD_MASK]))
    assert guard.feed("x" * 100) == "x" * 100  # nothing here can begin "banana" or "secret plan"
    assert guard.feed(" the SECRET pl") == " the "
    assert guard.feed("an.") == "***."


def test_personal_data_holds_back_only_the_characters_a_match_is_made_of():
    guard = AnswerGuard(TextPolicy([PII_MASK]))
    assert guard.feed("Plain prose goes out at once") == "Plain prose goes out at "  # "once": an e-mail's start?
    assert guard.feed(", but 4111 1111") == "once, but"
    assert guard.feed(" 1111 1111 ok") == " [card] "


def test_the_hold_back_is_bounded_by_the_longest_match():
    guard = AnswerGuard(TextPolicy([RuleSpec(1, "regex", REGEX, r"\d{3}", MASK)]))
    assert guard.feed("x" * 100) == "x" * (100 - 64)
    assert guard.flush() == "x" * 64


FRAGMENTS = [
    "alice@example.com",
    "bob.smith@mail.example.org",
    "+44 20 7946 0958",
    "(030) 1234 5678",
    "0301234567",
    "4111 1111 1111 1111",
    "4111-1111-1111-1112",
    "GB82 WEST 1234 5698 7654 32",
    "banana",
    "Banana",
    "bananas",
    "secret plan",
    "secret",
    "Project Apollo",
    "launch codes",
    "launch",
    " ",
    " ",
    ", ",
    ". ",
    "the",
    "people",
    "2024-01-15",
    "12345678",
    "x",
    "@",
    "+",
    "0",
    "-",
]


def test_random_texts_in_random_pieces_come_out_as_the_whole_text_would():
    rng = random.Random(36)
    policy = TextPolicy(RULES)
    for _ in range(500):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 12)))
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 8)))) if len(text) > 1 else []
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert streamed(policy, pieces) == expected_stream(text), (text, pieces)


def test_a_block_ends_the_answer_with_the_rules_message_and_drops_what_follows():
    guard = AnswerGuard(TextPolicy(RULES))
    out = guard.feed("Sure, the launch code")
    out += guard.feed("s are 1234 and banana" + " and so on" * 10)  # past the hold-back: decided
    assert guard.blocked
    assert out + guard.feed(" more text") + guard.flush() == "Sure, the \n\nI cannot help with that."
    assert [hit.rule.name for hit in guard.hits] == ["launch codes"]


def test_hits_name_each_rule_with_the_text_it_matched():
    applied = TextPolicy(RULES).apply("Project Zeus: banana to bob@example.org")
    assert [(hit.rule.action, hit.text) for hit in applied.hits] == [
        (FLAG, "Project Zeus"),
        (MASK, "banana"),
        (MASK, "bob@example.org"),
    ]
    assert applied.text == "Project Zeus: *** to [email]"


def test_the_first_rule_in_order_wins_a_match_of_the_same_span():
    first = RuleSpec(1, "first", WORDS, "banana", MASK, "[first]")
    second = RuleSpec(2, "second", WORDS, "banana", BLOCK, "no")
    assert TextPolicy([first, second]).apply("a banana").text == "a [first]"


def test_no_rules_let_everything_through_at_once():
    guard = AnswerGuard(TextPolicy([]))
    assert guard.feed("alice@example.com") == "alice@example.com"


@pytest.mark.parametrize(
    ("number", "valid"), [("4111111111111111", True), ("4111111111111112", False), ("79927398713", True)]
)
def test_card_numbers_pass_the_luhn_check(number, valid):
    assert luhn_valid(number) is valid


def test_an_iban_must_pass_its_check_digits():
    assert iban_valid("GB82 WEST 1234 5698 7654 32")
    assert not iban_valid("GB83 WEST 1234 5698 7654 32")


def test_a_bad_expression_or_pii_kind_is_refused():
    with pytest.raises(ValueError, match="regular expression"):
        validate_rule(RuleSpec(1, "bad", REGEX, "(unclosed", MASK))
    with pytest.raises(ValueError, match="unknown PII kinds: passport"):
        validate_rule(RuleSpec(1, "bad", PII, "email, passport", MASK))


def test_rules_travel_as_json():
    assert RuleSpec.from_json(PII_MASK.to_json()) == PII_MASK
