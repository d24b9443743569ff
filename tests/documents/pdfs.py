"""Real PDF files for the tests, written out byte by byte (pages of Helvetica text)."""

from __future__ import annotations

import io
import zlib

from pypdf import PdfReader, PdfWriter

FONT = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"


def pdf_with_text(*lines: str) -> bytes:
    """A one-page PDF whose page shows `lines` (ASCII), with a correct cross-reference table."""
    escaped = [line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") for line in lines]
    text = " T* ".join(f"({line}) Tj" for line in escaped)
    content = f"BT /F1 12 Tf 14 TL 72 720 Td {text} ET".encode()
    return _pdf_of_pages(1, b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content))


def pdf_of_shared_stream(operators: str, *, pages: int, repeat: int) -> bytes:
    """A PDF of `pages` pages that all show one Flate-compressed content stream, which holds
    `operators` `repeat` times: a few kilobytes that read as `pages` times the stream's text."""
    content = b"BT /F1 12 Tf 72 720 Td " + operators.encode() * repeat + b" ET"
    packed = zlib.compress(content, 9)
    return _pdf_of_pages(pages, b"<< /Length %d /Filter /FlateDecode >>\nstream\n%s\nendstream" % (len(packed), packed))


def many_tiny_operators_pdf() -> bytes:
    """The costly case of a small file: 25 pages sharing one stream of 100,000 `(a) Tj`
    (about 5 KB; a minute of one core for pypdf to read in full)."""
    return pdf_of_shared_stream("(a) Tj ", pages=25, repeat=100_000)


def encrypted_pdf(*lines: str) -> bytes:
    """The same page, encrypted with a user password (pypdf's writer)."""
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf_with_text(*lines))))
    writer.encrypt("secret")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def _pdf_of_pages(pages: int, content: bytes) -> bytes:
    """A PDF of `pages` pages whose /Contents is the one stream object `content`."""
    page_numbers = range(5, 5 + pages)
    kids = b" ".join(b"%d 0 R" % number for number in page_numbers)
    page = (
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 3 0 R "
        b"/Resources << /Font << /F1 4 0 R >> >> >>"
    )
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, pages),
        content,
        FONT,
        *[page] * pages,
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)
