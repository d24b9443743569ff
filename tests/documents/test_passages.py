"""Splitting a document's text into passages (documents.passages, plain Python)."""

from __future__ import annotations

from documents.passages import OVERLAP_WORDS, PASSAGE_WORDS, PassageText, passages_of


def words(count: int, prefix: str = "w") -> str:
    return " ".join(f"{prefix}{n}" for n in range(count))


def test_short_paragraphs_under_one_heading_make_one_passage():
    text = "# Tides\n\nThe Moon pulls the sea.\n\nTwice a day, mostly.\n"

    assert passages_of(text) == [PassageText("Tides", "The Moon pulls the sea. Twice a day, mostly.")]


def test_each_heading_starts_a_new_passage_and_text_before_the_first_has_none():
    text = "Preface words.\n\n## One\nFirst part.\n\n### Two ###\nSecond part.\n"

    assert passages_of(text) == [
        PassageText("", "Preface words."),
        PassageText("One", "First part."),
        PassageText("Two", "Second part."),
    ]


def test_paragraphs_are_packed_up_to_the_passage_size_and_neighbours_overlap():
    paragraphs = [words(120, "a"), words(120, "b"), words(120, "c")]

    passages = passages_of("\n\n".join(paragraphs))

    assert [len(p.text.split()) for p in passages] == [120, OVERLAP_WORDS + 120, OVERLAP_WORDS + 120]
    assert passages[1].text.split()[:OVERLAP_WORDS] == paragraphs[0].split()[-OVERLAP_WORDS:]
    assert passages[2].text.split()[:OVERLAP_WORDS] == paragraphs[1].split()[-OVERLAP_WORDS:]


def test_a_paragraph_longer_than_a_passage_is_cut_into_overlapping_windows():
    passages = passages_of(words(450))

    assert all(len(p.text.split()) <= PASSAGE_WORDS for p in passages)
    assert passages[0].text.split()[-OVERLAP_WORDS:] == passages[1].text.split()[:OVERLAP_WORDS]
    covered = {word for p in passages for word in p.text.split()}
    assert covered == set(words(450).split())


def test_text_without_words_has_no_passages():
    assert passages_of("") == []
    assert passages_of(" \n\n\t\r\n ") == []


def test_windows_line_endings_and_long_headings_are_handled():
    passages = passages_of("# " + "h" * 600 + "\r\n\r\nBody text.\r\n")

    assert passages == [PassageText("h" * 500, "Body text.")]
