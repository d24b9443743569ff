"""Splitting a document's text into passages: plain Python, tested alone.

Passages follow the text's own structure: a Markdown heading starts a new section, and
a section's paragraphs are packed into passages of about PASSAGE_WORDS words (a few
hundred tokens: English runs about 0.75 words a token). Consecutive passages of a section
share OVERLAP_WORDS words, so that a sentence cut at a boundary is whole in one of them.
A paragraph longer than a passage is cut into overlapping windows of words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PASSAGE_WORDS = 200
OVERLAP_WORDS = 40
HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$")
BLANK_LINES = re.compile(r"\n\s*\n")


@dataclass(frozen=True)
class PassageText:
    heading: str
    text: str


def passages_of(text: str) -> list[PassageText]:
    """The passages of a document's text, in order; none for text without words."""
    passages: list[PassageText] = []
    for heading, body in _sections(text):
        paragraphs = [" ".join(paragraph.split()) for paragraph in BLANK_LINES.split(body)]
        passages.extend(PassageText(heading, words) for words in _packed([p for p in paragraphs if p]))
    return passages


def _sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) for each part of the text under a Markdown heading ("" before the first)."""
    sections: list[tuple[str, list[str]]] = [("", [])]
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if match := HEADING.match(line):
            sections.append((match.group(1)[:500], []))
        else:
            sections[-1][1].append(line)
    return [(heading, "\n".join(lines)) for heading, lines in sections if heading or any(s.strip() for s in lines)]


def _packed(paragraphs: list[str]) -> list[str]:
    """Paragraphs packed into passages of at most PASSAGE_WORDS words, overlapping."""
    passages: list[str] = []
    current: list[str] = []
    fresh = 0  # words in `current` that no earlier passage holds
    for paragraph in paragraphs:
        words = paragraph.split()
        if len(current) + len(words) > PASSAGE_WORDS and fresh:
            passages.append(" ".join(current))
            current, fresh = current[-OVERLAP_WORDS:], 0
        while len(current) + len(words) > PASSAGE_WORDS:
            room = PASSAGE_WORDS - len(current)
            current, words = current + words[:room], words[room:]
            passages.append(" ".join(current))
            current, fresh = current[-OVERLAP_WORDS:], 0
        current += words
        fresh += len(words)
    if fresh:
        passages.append(" ".join(current))
    return passages
