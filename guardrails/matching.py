"""Policy rules as plain Python: find matches in a prompt, and in an answer while it streams.

An answer is fed piece by piece (a token's text at a time) to an `AnswerGuard`, which gives
back only the text that no rule can still change, as the engine's StopMatcher holds back
what may be the start of a stop string. What waits is bounded by each rule's `hold_back`,
and shorter where the rule can tell: a word list holds back only an end of the text that
begins one of its words; personal data only the run of characters its patterns are made
of (digits and spaces for a card number, say), so plain prose goes out at once; a regular
expression holds back its last 64 characters. Whatever the pieces, the text given out is
the text that `TextPolicy.apply` makes of the whole answer at once, for matches no longer
than the hold-back (a regular expression's match beyond it may be cut in two; say so to
whoever writes one). No Django imports here: the engine's and the model-server pool's
threads run this.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

WORDS, REGEX, PII, MODERATION = "words", "regex", "pii", "moderation"
BLOCK, MASK, FLAG = "block", "mask", "flag"
# What a masked match becomes when its rule names nothing else.
DEFAULT_MASK = "[redacted]"
# The longest match a regular expression or a PII detector is held back for.
REGEX_HOLD_BACK = 64
PII_HOLD_BACK = 96
# Characters of released text kept as look-behind, for `\b` and `(?<!…)` at the seam.
CONTEXT = 32


@dataclass(frozen=True)
class RuleSpec:
    """One rule as data: what the admin set, plain JSON, so that it travels with a task."""

    id: int
    name: str
    matcher: str  # WORDS, REGEX or PII (MODERATION rules are asked over HTTP, not here)
    pattern: str  # words: one per line; regex: the expression; pii: kinds, comma-separated
    action: str  # BLOCK, MASK or FLAG
    message: str = ""  # BLOCK: what the user is told; MASK: what a match becomes
    # A moderation service's (guardrails.moderation): how long it may take, what a failure
    # means (True: allow), and its Bearer token. Defaults for tasks queued before they were sent.
    timeout_s: float = 2.0
    fail_open: bool = True
    token: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RuleSpec:
        return cls(**data)


@dataclass(frozen=True)
class Hit:
    rule: RuleSpec
    start: int
    end: int
    text: str  # the matched text, as it was
    kind: str = ""  # a PII detector's: "email", "phone", "iban", "card"

    @property
    def replacement(self) -> str:
        if self.rule.message:
            return self.rule.message
        return f"[{self.kind}]" if self.kind else DEFAULT_MASK


# -- PII detectors -------------------------------------------------------------------------


def luhn_valid(digits: str) -> bool:
    """The Luhn check digit of card numbers."""
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char)
        if index % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def iban_valid(text: str) -> bool:
    """ISO 13616's check: the account moved behind its country and check digits, as a
    number in which letters count 10 to 35, leaves 1 modulo 97."""
    compact = text.replace(" ", "")
    if not 15 <= len(compact) <= 34:
        return False
    moved = compact[4:] + compact[:4]
    return int("".join(str(int(char, 36)) for char in moved)) % 97 == 1


def _card_valid(text: str) -> bool:
    digits = re.sub(r"\D", "", text)
    return 13 <= len(digits) <= 19 and luhn_valid(digits)


def _phone_valid(text: str) -> bool:
    return 8 <= sum(char.isdigit() for char in text) <= 15


@dataclass(frozen=True)
class _Detector:
    kind: str
    pattern: re.Pattern[str]
    valid: Callable[[str], bool] | None = None
    # The run of characters at the end of a text that a match could go on from: each
    # character any match of `pattern` is made of (None: unknown, hold back in full).
    run: re.Pattern[str] | None = None


# Each pattern's longest match, with the one character after it that its end looks at, fits
# in PII_HOLD_BACK (an e-mail address: 40 + 1 + 2 * 21 + 12 + 1).
PII_DETECTORS = {
    "email": _Detector(
        "email",
        re.compile(r"(?<![\w.%+-])[\w.%+-]{1,40}@(?:[A-Za-z0-9-]{1,20}\.){1,2}[A-Za-z]{2,12}(?![\w-])"),
        run=re.compile(r"[\w.%+@-]*\Z"),
    ),
    "iban": _Detector(
        "iban",
        re.compile(r"(?<![A-Z0-9])[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?(?![A-Z0-9])"),
        iban_valid,
        re.compile(r"[A-Z0-9 ]*\Z"),
    ),
    "card": _Detector(
        "card", re.compile(r"(?<![\d-])(?:\d[ -]?){12,18}\d(?![\d])"), _card_valid, re.compile(r"[\d -]*\Z")
    ),
    "phone": _Detector(
        "phone",
        re.compile(r"(?<![\w+])(?:\+\d{1,3}|\(0?\d{1,4}\)|0)(?:[ ./-]?\(?\d{1,4}\)?){2,5}(?![\w])"),
        _phone_valid,
        re.compile(r"[\d +()./-]*\Z"),
    ),
}


# -- rules -----------------------------------------------------------------------------


class _Matcher:
    """One rule compiled: the earliest valid match at or after a position."""

    def __init__(self, rule: RuleSpec) -> None:
        self.rule = rule
        self.detectors: list[_Detector] = []
        self.word_prefixes: set[str] | None = None
        if rule.matcher == WORDS:
            words = sorted({w.strip() for w in re.split(r"[\n,]", rule.pattern) if w.strip()}, key=len, reverse=True)
            self.hold_back = max((len(w) for w in words), default=0) + 1
            self.word_prefixes = {w.lower()[:size] for w in words for size in range(1, len(w) + 1)}
            if words:
                expression = r"(?<!\w)(?:" + "|".join(re.escape(w) for w in words) + r")(?!\w)"
                self.detectors.append(_Detector("", re.compile(expression, re.IGNORECASE)))
        elif rule.matcher == REGEX:
            self.hold_back = REGEX_HOLD_BACK
            self.detectors.append(_Detector("", re.compile(rule.pattern)))
        elif rule.matcher == PII:
            self.hold_back = PII_HOLD_BACK
            kinds = [k.strip() for k in rule.pattern.split(",") if k.strip()] or list(PII_DETECTORS)
            self.detectors += [PII_DETECTORS[kind] for kind in kinds]
        else:
            raise ValueError(f"a {rule.matcher!r} rule is not matched in text")

    def held_from(self, text: str, pos: int) -> int:
        """Where the end of `text` that more text could still make part of a match begins."""
        floor = max(pos, len(text) - self.hold_back)
        if self.word_prefixes is not None:  # from the first end that begins a word (or is one, its end unseen)
            return next((at for at in range(floor, len(text)) if text[at:].lower() in self.word_prefixes), len(text))
        held = len(text)
        for detector in self.detectors:
            if detector.run is None:
                return floor
            found = detector.run.search(text, floor)
            held = min(held, found.start() if found else len(text))
        return held

    def search(self, text: str, pos: int) -> Hit | None:
        best: Hit | None = None
        for detector in self.detectors:
            at = pos
            while (found := detector.pattern.search(text, at)) is not None:
                if found.end() > found.start() and (detector.valid is None or detector.valid(found.group())):
                    if best is None or found.start() < best.start:
                        best = Hit(self.rule, found.start(), found.end(), found.group(), detector.kind)
                    break
                at = found.start() + 1
        return best


def pii_kinds() -> list[str]:
    return list(PII_DETECTORS)


def validate_rule(rule: RuleSpec) -> None:
    """Raise ValueError for a rule that cannot run (a bad expression, an unknown PII kind)."""
    if rule.matcher == REGEX:
        try:
            re.compile(rule.pattern)
        except re.error as error:
            raise ValueError(f"not a regular expression: {error}") from None
    if rule.matcher == PII:
        unknown = {k.strip() for k in rule.pattern.split(",") if k.strip()} - PII_DETECTORS.keys()
        if unknown:
            raise ValueError(f"unknown PII kinds: {', '.join(sorted(unknown))} (known: {', '.join(PII_DETECTORS)})")


@dataclass
class Applied:
    """A whole text after the rules: masked, and cut where a block rule matched."""

    text: str
    hits: list[Hit] = field(default_factory=list)
    blocked_by: Hit | None = None
    end: int = 0  # where the rules stopped reading (a stream's next piece goes on from there)


class TextPolicy:
    """Ordered rules over a text. At each point the earliest match wins, the longest of
    those, then the rule first in order; matching goes on after it."""

    def __init__(self, rules: Iterable[RuleSpec]) -> None:
        self.matchers = [_Matcher(rule) for rule in rules if rule.matcher != MODERATION]
        self.hold_back = max((m.hold_back for m in self.matchers), default=0)

    def __bool__(self) -> bool:
        return bool(self.matchers)

    def held_from(self, text: str, pos: int) -> int:
        """Where the end of a streamed text that no rule can decide yet begins."""
        return min((matcher.held_from(text, pos) for matcher in self.matchers), default=len(text))

    def next_hit(self, text: str, pos: int) -> Hit | None:
        best: Hit | None = None
        for matcher in self.matchers:
            hit = matcher.search(text, pos)
            if hit is not None and (best is None or (hit.start, -hit.end) < (best.start, -best.end)):
                best = hit
        return best

    def apply(self, text: str) -> Applied:
        applied = Applied("")
        applied.text = _released(self, text, 0, len(text), applied)
        return applied


def _released(policy: TextPolicy, text: str, pos: int, cut: int, into: Applied) -> str:
    """The text from `pos` up to `cut` (or past it, to the end of a match begun before it)
    after the rules; the hits go into `into`, and stop at a block. Sets `into.end`."""
    out: list[str] = []
    while into.blocked_by is None and (hit := policy.next_hit(text, pos)) is not None and hit.start < cut:
        out.append(text[pos : hit.start])
        into.hits.append(hit)
        if hit.rule.action == BLOCK:
            into.blocked_by = hit
            pos = len(text)
            break
        out.append(hit.replacement if hit.rule.action == MASK else hit.text)
        pos = hit.end
    if into.blocked_by is None and pos < cut:
        out.append(text[pos:cut])
        pos = cut
    into.end = pos
    return "".join(out)


STOPPED = "This answer was stopped by a content policy."


class Moderation(Protocol):
    """A judge of the text the rules let out, which holds it back until judged
    (guardrails.moderation.AnswerModeration): `add` what the rules released, `take` what is
    judged clean so far without waiting, `drain` the rest once the answer ends (waiting
    for its verdicts, each within its rule's timeout). `blocked_by` once it refused."""

    hits: list[Hit]
    blocked_by: Hit | None

    def add(self, text: str) -> None: ...
    def take(self) -> str: ...
    def drain(self) -> str: ...


class AnswerGuard:
    """The answer rules on a stream: `feed` each piece, `flush` at the end (inference's
    TextFilter). Once a block rule matched, `blocked` is set, the answer ends with the
    rule's message, and what comes after is dropped. With a `moderation`, what the rules
    let out goes out only once a moderation service judged it."""

    def __init__(self, policy: TextPolicy, moderation: Moderation | None = None) -> None:
        self.policy = policy
        self.moderation = moderation
        self.blocked = False
        self.blocked_by: Hit | None = None
        self._hits: list[Hit] = []
        self._held = ""
        self._context = ""
        self._shown = False  # whether any text went out: a block's message is set apart from it

    @classmethod
    def of(cls, rules: Iterable[RuleSpec]) -> AnswerGuard:
        return cls(TextPolicy(rules))

    @property
    def hits(self) -> list[Hit]:
        return self._hits + (self.moderation.hits if self.moderation is not None else [])

    def feed(self, text: str) -> str:
        if self.blocked:
            return ""
        self._held += text
        return self._emit(*self._release(final=False), final=False)

    def flush(self) -> str:
        if self.blocked:
            return ""
        return self._emit(*self._release(final=True), final=True)

    def _release(self, *, final: bool) -> tuple[str, Hit | None]:
        """The text the rules let out now, and the block that ended it, if one did."""
        text = self._context + self._held
        base = len(self._context)
        cut = len(text) if final else self.policy.held_from(text, base)
        if cut <= base and not final:
            return "", None
        applied = Applied("")
        out = _released(self.policy, text, base, cut, applied)
        self._hits += applied.hits
        end = applied.end
        self._context = text[max(0, end - CONTEXT) : end]
        self._held = "" if applied.blocked_by is not None else text[end:]
        return out, applied.blocked_by

    def _emit(self, out: str, block: Hit | None, *, final: bool) -> str:
        """What goes out of what the rules released: once judged, where a moderation
        service judges it (all of it, waiting, at the end or before a block's message)."""
        if self.moderation is not None:
            self.moderation.add(out)
            out = self.moderation.drain() if final or block is not None else self.moderation.take()
            if self.moderation.blocked_by is not None:
                if block is not None:  # it matched text after the refused piece: never reached
                    self._hits.remove(block)
                block = self.moderation.blocked_by
        if block is None:
            self._shown = self._shown or bool(out)
            return out
        self.blocked, self.blocked_by = True, block
        return out + ("\n\n" if out or self._shown else "") + (block.rule.message or STOPPED)
