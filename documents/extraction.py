"""The text of an uploaded file: UTF-8 text, Markdown or PDF. Plain Python, no Django.

Every way a file can be unusable ends in UnreadableDocument with words for the person
who sent it; nothing else escapes.

PDF parsing is CPU work on untrusted input, and a few kilobytes can ask for minutes of it
(pages that share one compressed stream of tiny text operators), so the work itself is
bounded, not only the file. pypdf runs in a child process, this file run as a script,
which is killed after PDF_EXTRACT_SECONDS; it stops at MAX_PDF_PAGES pages or
MAX_PDF_CHARS characters of text, its address space is capped at PDF_MEMORY_BYTES, and at
most PDF_READERS such children run at once in a web process. Each limit refuses the file
with words that name it.

Why a fresh interpreter and not multiprocessing: forking the web process is unsafe, since
it is multi-threaded (a lock held by another thread stays held in the child forever).
multiprocessing's "spawn" and "forkserver" children are safe, but each one runs the
parent's main script again before its target (Python 3.11's forkserver cannot preload it),
and under daphne that is daphne and Twisted: about 1 s per file here. A plain
`python -P extraction.py` starts and imports pypdf in about 0.2 s, and needs no Django.
"""

from __future__ import annotations

import io
import json
import logging
import resource
import subprocess
import sys
import threading
from pathlib import PurePath

from pypdf import PdfReader
from pypdf.errors import PyPdfError

KINDS = {".txt": "text", ".text": "text", ".md": "markdown", ".markdown": "markdown", ".pdf": "pdf"}
ACCEPTED = ", ".join(sorted(KINDS))
MAX_PDF_PAGES = 500
# As much text as the largest text file the default plan takes (max_document_bytes, 2 MB);
# an ordinary page holds about 3,000 characters, so a 500-page book fits.
MAX_PDF_CHARS = 2_000_000
# A 500-page book of plain text pages reads in about 2 s; the costly 5 KB file of the
# tests would take a minute.
PDF_EXTRACT_SECONDS = 10.0
# pypdf holds at most 75 MB of any one decompressed stream; the child's whole address
# space, interpreter included, stays under this.
PDF_MEMORY_BYTES = 1024 * 1024 * 1024
# PDFs read at once, each on a core of its own: the rest of the web process keeps the others.
PDF_READERS = 2
# How long an upload waits for a reader before it is refused. Short, because the waiting
# holds one of the event loop's worker threads, which other requests share.
PDF_WAIT_SECONDS = 3.0

logger = logging.getLogger(__name__)
_readers = threading.BoundedSemaphore(PDF_READERS)


class UnreadableDocument(ValueError):
    """A file that cannot become passages; its message says why, to the person who sent it."""


def kind_of(name: str) -> str:
    """The document kind its name says (text, markdown or pdf); UnreadableDocument otherwise."""
    kind = KINDS.get(PurePath(name).suffix.lower())
    if kind is None:
        raise UnreadableDocument(f"{name} is not a text, Markdown or PDF file ({ACCEPTED}).")
    return kind


def text_of(name: str, kind: str, data: bytes) -> str:
    """The file's text, with words in it; UnreadableDocument if it has none or is broken.

    A PDF may wait PDF_WAIT_SECONDS for its turn and then take PDF_EXTRACT_SECONDS:
    call this off the event loop.
    """
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
    # Read once, so that the child's limits and the words that name them agree.
    pages, chars, seconds = MAX_PDF_PAGES, MAX_PDF_CHARS, PDF_EXTRACT_SECONDS
    if not _readers.acquire(timeout=PDF_WAIT_SECONDS):
        raise UnreadableDocument(f"{name} was not read: the server is busy reading other PDFs; try again in a minute.")
    try:
        outcome, detail = _read_in_child(data, [pages, chars, PDF_MEMORY_BYTES], seconds)
    finally:
        _readers.release()
    if outcome == "text":
        return detail
    if outcome != "damaged":
        logger.info("PDF upload refused (%s): %s", outcome, name)
    refusals = {
        "encrypted": f"{name} is encrypted; attach a copy without a password.",
        "pages": f"{name} has more than {pages} pages.",
        "chars": f"{name} has more text than a PDF may hold ({chars:,} characters).",
        "slow": f"{name} took too long to read (over {seconds:g} seconds); its pages may be built in a costly way.",
        "memory": f"{name} needs too much memory to read.",
    }
    if outcome in refusals:
        raise UnreadableDocument(refusals[outcome])
    logger.info("Unreadable PDF upload: %s", detail)
    raise UnreadableDocument(f"{name} is not a PDF that can be read (it may be damaged).")


def _read_in_child(data: bytes, limits: list[int], seconds: float) -> tuple[str, str]:
    """(outcome, detail) of reading the PDF in a child process (see _child_main), or
    ("slow", "") when it was killed at the deadline."""
    # -P: the script's folder (this app, with a selectors.py) stays off the child's sys.path.
    command = [sys.executable, "-P", __file__, *map(str, limits)]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as child:
        try:
            answer, _ = child.communicate(data, timeout=seconds)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            return "slow", ""
    try:
        outcome, detail = json.loads(answer)
    except ValueError:
        return "damaged", f"the reading process ended without an answer (exit code {child.returncode})"
    return str(outcome), str(detail)


def _child_main() -> None:
    """The child: the PDF on stdin, its limits as arguments; [outcome, detail] as JSON on stdout."""
    max_pages, max_chars, memory = map(int, sys.argv[1:4])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    logging.disable(logging.CRITICAL)  # pypdf warns about each oddity of a malformed file, at a cost
    answer = sys.stdout
    sys.stdout = sys.stderr
    try:
        outcome = _pdf_pages_text(sys.stdin.buffer.read(), max_pages, max_chars)
    except MemoryError:
        outcome = ("memory", "")
    except (PyPdfError, ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as error:
        # pypdf raises more than its own errors on malformed files; each means "broken".
        outcome = ("damaged", f"{type(error).__name__}: {error}")
    answer.write(json.dumps(outcome))
    answer.flush()


def _pdf_pages_text(data: bytes, max_pages: int, max_chars: int) -> tuple[str, str]:
    reader = PdfReader(io.BytesIO(data))
    if reader.is_encrypted:
        return "encrypted", ""
    if len(reader.pages) > max_pages:
        return "pages", ""
    texts: list[str] = []
    chars = 0
    for page in reader.pages:
        texts.append(page.extract_text() or "")
        chars += len(texts[-1])
        if chars > max_chars:
            return "chars", ""
    return "text", "\n\n".join(texts)


if __name__ == "__main__":
    _child_main()
