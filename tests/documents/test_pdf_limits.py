"""PDF reading is bounded by the work it takes, not only by the file's size: a deadline
and a cap on the characters extracted, each refusing the file with words that name it."""

from __future__ import annotations

import time

import pytest

from documents import extraction
from documents.extraction import UnreadableDocument, text_of
from documents.models import Document, Passage
from generation.models import Conversation
from tests.documents.pdfs import many_tiny_operators_pdf, pdf_of_shared_stream, pdf_with_text
from tests.support.uploads import upload

# The costly file takes about a minute to read in full; with a 1 s deadline the refusal
# comes after that second and a child's start (0.2 s). The bound leaves a margin of 10x.
DEADLINE_S = 1.0
WITHIN_S = 15.0


@pytest.fixture
def short_deadline(monkeypatch) -> None:
    monkeypatch.setattr(extraction, "PDF_EXTRACT_SECONDS", DEADLINE_S)


def test_a_small_pdf_that_costs_minutes_is_refused_at_the_deadline_naming_it(short_deadline):
    costly = many_tiny_operators_pdf()
    assert len(costly) < 10_000
    began = time.monotonic()

    with pytest.raises(UnreadableDocument) as refused:
        text_of("costly.pdf", "pdf", costly)

    assert time.monotonic() - began < WITHIN_S
    assert "costly.pdf took too long to read (over 1 seconds)" in str(refused.value)


def test_a_pdf_with_more_text_than_the_cap_is_refused_naming_the_cap(monkeypatch):
    monkeypatch.setattr(extraction, "MAX_PDF_CHARS", 1_000)
    wordy = pdf_of_shared_stream("(words) Tj ", pages=3, repeat=100)  # 500 characters a page

    with pytest.raises(UnreadableDocument) as refused:
        text_of("wordy.pdf", "pdf", wordy)

    assert str(refused.value) == "wordy.pdf has more text than a PDF may hold (1,000 characters)."


def test_an_ordinary_pdf_still_reads_within_the_limits(short_deadline, monkeypatch):
    monkeypatch.setattr(extraction, "MAX_PDF_CHARS", 1_000)

    keepers = pdf_with_text("Fresnel lenses focus the beam.")
    assert "Fresnel lenses focus the beam." in text_of("keepers.pdf", "pdf", keepers)
    pages = text_of("pages.pdf", "pdf", pdf_of_shared_stream("(words) Tj ", pages=3, repeat=50))
    assert pages.split("\n\n") == ["words" * 50] * 3


@pytest.mark.django_db
def test_uploading_the_costly_pdf_tells_the_user_why_and_stores_nothing(alice, alice_client, short_deadline):
    conversation = Conversation.objects.create(user=alice, model="smollm2-135m-instruct", title="Notes")

    response = upload(alice_client, conversation, "costly.pdf", many_tiny_operators_pdf())

    assert response.status_code == 422
    assert 'role="alert"' in response.text
    assert "costly.pdf took too long to read (over 1 seconds)" in response.text
    assert not Document.objects.exists()
    assert not Passage.objects.exists()
