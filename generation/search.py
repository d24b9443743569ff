"""Search one user's conversations by title and message text, with the database's full-text index.

The indexes come from migration 0004_search_index: FTS5 tables on SQLite, GIN indexes on
`to_tsvector('simple', …)` on PostgreSQL. Both match every word typed as a word prefix
("lisb" finds "Lisbon"), ignoring case; neither stems, so what is highlighted is what was
typed. SQLite also ignores accents ("belem" finds "Belém"); PostgreSQL's `simple`
configuration does not (that would take the unaccent extension, a superuser's install).
The query is reduced to plain words here, so no search syntax reaches the database.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from html import escape
from typing import TypeVar

from django.contrib.auth.models import User
from django.contrib.postgres.search import SearchQuery, SearchVector
from django.db import connections
from django.db.models import Model, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils.safestring import SafeString, mark_safe

from generation.models import Conversation, Message

MAX_QUERY_CHARS = 200
# More words would only make the index work harder for the same few conversations.
MAX_TERMS = 8
MAX_RESULTS = 50
EXCERPT_CHARS = 160
SEARCH_CONFIG = "simple"

# Letters and digits of any script; everything else (quotes, operators, `_`) separates words.
_WORD = re.compile(r"[^\W_]+")

ModelT = TypeVar("ModelT", bound=Model)

# Each searched model's FTS5 table on SQLite, and its column that holds the row's key.
SQLITE_INDEXES: dict[type[Model], tuple[str, str]] = {
    Message: ("generation_message_search", "rowid"),
    Conversation: ("generation_conversation_search", "conversation_id"),
}


class SearchUnavailable(Exception):
    """The database has no full-text index that this module knows."""


@dataclass(frozen=True)
class SearchHit:
    conversation: Conversation
    title: SafeString  # highlighted
    excerpt: SafeString  # a highlighted passage of a matching message; empty if only the title matched


def search_terms(query: str) -> list[str]:
    """The distinct words of a query, lower-cased, at most MAX_TERMS of them."""
    terms = dict.fromkeys(word.casefold() for word in _WORD.findall(query))
    return list(terms)[:MAX_TERMS]


def conversation_search(
    *, user: User, terms: list[str], include_archived: bool = False, limit: int = MAX_RESULTS
) -> list[SearchHit]:
    """The user's conversations whose title, or one of whose messages, contains every term,
    newest first, each with its best passage highlighted; archived ones only if asked."""
    if not terms:
        return []
    by_title = _matching(Conversation.objects.filter(user=user), "title", terms)
    by_message = _matching(Message.objects.filter(conversation__user=user), "content", terms)
    matching = Conversation.objects.filter(user=user).filter(
        Q(pk__in=by_title.values("pk")) | Q(pk__in=by_message.values("conversation_id"))
    )
    if not include_archived:
        matching = matching.filter(archived_at__isnull=True)
    found = list(matching.order_by("-updated_at")[:limit])
    # The newest matching message of each conversation found gives its excerpt.
    excerpts: dict[object, str] = {}
    for conversation_id, content in (
        by_message.filter(conversation__in=found).order_by("-created_at").values_list("conversation_id", "content")
    ):
        excerpts.setdefault(conversation_id, content)
    return [
        SearchHit(
            conversation=conversation,
            title=highlight(str(conversation), terms),
            excerpt=highlight(excerpts[conversation.pk], terms) if conversation.pk in excerpts else SafeString(""),
        )
        for conversation in found
    ]


def _matching(queryset: QuerySet[ModelT], field: str, terms: list[str]) -> QuerySet[ModelT]:
    """The rows of `queryset` whose `field` contains every term as a word prefix."""
    vendor = connections[queryset.db].vendor
    if vendor == "postgresql":
        # Terms are letters and digits only: safe as raw tsquery words.
        query = SearchQuery(" & ".join(f"{term}:*" for term in terms), search_type="raw", config=SEARCH_CONFIG)
        return queryset.alias(document=SearchVector(field, config=SEARCH_CONFIG)).filter(document=query)
    if vendor == "sqlite":
        index, key = SQLITE_INDEXES[queryset.model]
        # Each term a quoted FTS5 string with a prefix star: no FTS5 syntax from the user.
        match = " ".join(f'"{term}"*' for term in terms)
        return queryset.filter(pk__in=RawSQL(f"SELECT {key} FROM {index} WHERE {index} MATCH %s", [match]))
    raise SearchUnavailable(f"Search needs SQLite or PostgreSQL, not {vendor}.")


def highlight(text: str, terms: list[str], *, width: int = EXCERPT_CHARS) -> SafeString:
    """A passage of `text` around the first match, escaped, with each term's match in `<mark>`
    (ignoring case and accents, as the SQLite index does)."""
    text = " ".join(text.split())
    folded = _without_accents(text)  # matched here, cut from `text`: the positions are the same
    alternatives = "|".join(re.escape(_without_accents(term)) for term in terms)
    pattern = re.compile(rf"\b(?:{alternatives})", re.IGNORECASE)
    first = pattern.search(folded)
    start = 0
    if first and first.start() > width // 4:  # begin at a word a little before the match
        space = text.find(" ", first.start() - width // 4, first.start())
        start = space + 1 if space >= 0 else first.start()
    end = start + width
    pieces: list[str] = ["…" if start else ""]
    shown = start
    for match in pattern.finditer(folded, start, end):
        match_end = min(match.end(), end)
        pieces += [escape(text[shown : match.start()]), f"<mark>{escape(text[match.start() : match_end])}</mark>"]
        shown = match_end
    pieces += [escape(text[shown:end]), "…" if end < len(text) else ""]
    # mark_safe is sound: every piece of the text went through escape(); only <mark> is added.
    return mark_safe("".join(pieces))


def _without_accents(text: str) -> str:
    """`text` with each letter's accents dropped, one character for one ("é" → "e")."""
    return "".join(unicodedata.normalize("NFD", char)[0] for char in text)
