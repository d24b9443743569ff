"""The text of an uploaded file: UTF-8 text, Markdown or PDF. Plain Python, no Django.

Every way a file can be unusable ends in UnreadableDocument with words for the person
who sent it; nothing else escapes. PDF parsing is CPU work on untrusted input, so it is
bounded: at most MAX_PDF_PAGES pages, and the caller runs it off the event loop.
"""

from __future__ import annotations

import io
import logging
from pathlib import PurePath

from pypdf import PdfReader
from pypdf.errors import PyPdfError

KINDS = {".txt": "text", ".text": "text", ".md": "markdown", ".markdown": "markdown", ".pdf": "pdf"}
ACCEPTED = ", ".join(sorted(KINDS))
MAX_PDF_PAGES = 500

logger = logging.getLogger(__name__)


class UnreadableDocument(ValueError):
    """A file that cannot become passages; its message says why, to the person who sent it."""


def kind_of(name: str) -> str:
    """The document kind its name says (text, markdown or pdf); UnreadableDocument otherwise."""
    kind = KINDS.get(PurePath(name).suffix.lower())
    if kind is None:
        raise UnreadableDocument(f"{name} is not a text, Markdown or PDF file ({ACCEPTED}).")
    return kind


def text_of(name: str, kind: str, data: bytes) -> str:
    """The file's text, with words in it; UnreadableDocument if it has none or is broken."""
    if not data:
        raise UnreadableDocument(f"{name} is empty.")
    text = _pdf_text(name, data) if kind == "pdf" else _plain_text(name, data)
    if not text.split():
        raise UnreadableDocument(f"{name} has no text to search" + (" (a scanned PDF?)." if kind == "pdf" else "."))
    return text


def _plain_text(name: str, data: bytes) -> str:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UnreadableDocument(f"{name} is not UTF-8 text.") from None
    if "\x00" in text:  # a binary file named .txt: UTF-8 can hold NUL, no text file does
        raise UnreadableDocument(f"{name} is not a text file.")
    return text


def _pdf_text(name: str, data: bytes) -> str:
    if not data.startswith(b"%PDF-"):
        raise UnreadableDocument(f"{name} is not a PDF file.")
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise UnreadableDocument(f"{name} is encrypted; attach a copy without a password.")
        if len(reader.pages) > MAX_PDF_PAGES:
            raise UnreadableDocument(f"{name} has more than {MAX_PDF_PAGES} pages.")
        return "\n\n".join(page.extract_text() or "" for page in reader.pages)
    except UnreadableDocument:
        raise
    except (PyPdfError, ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as error:
        # pypdf raises more than its own errors on malformed files; each means "broken".
        logger.info("Unreadable PDF upload: %s: %s", type(error).__name__, error)
        raise UnreadableDocument(f"{name} is not a PDF that can be read (it may be damaged).") from None
