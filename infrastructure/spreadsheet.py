"""CSV cells that a spreadsheet shows as written."""

from __future__ import annotations

# A spreadsheet runs a cell that starts with one of these as a formula; usernames and
# model names are chosen by users ("CSV injection", OWASP).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> object:
    """A CSV cell that a spreadsheet shows as written: text that would start a formula
    gets OWASP's leading single quote; numbers stay numbers."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value
