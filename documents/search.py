"""Full-text search of passages in the database itself: no search server to run.

One seam, `PassageSearch`, with a backend per database vendor, chosen by the connection:

- SQLite (the embedded default): an FTS5 table, `documents_passage_fts`, made by the
  migration with the Porter stemmer, kept in step with `documents_passage` by triggers
  (so cascading deletes of conversations, documents and users leave nothing behind), and
  ranked by BM25, headings weighing twice as much as text.
- PostgreSQL: the `search` tsvector of each passage (English configuration, heading
  weighted A and text B), written when a document is added, with a GIN index made by the
  migration, and ranked by cover density (`ts_rank_cd`) through django.contrib.postgres;
  at most MAX_RANKED matches are ranked per query.

A question is searched by its words minus common ones, in two steps (`passages_search`):
first the passages holding at least two of them, and only when there are none, those holding
any one. A passage with two of the words is the better candidate anyway, and the step keeps
the rows to rank few: ranking, not matching, is what costs (BM25 or ts_rank_cd read every
matching row), and a word common in the documents matches thousands of passages.
The search only ever looks at the document ids it is given, which the caller takes from
one user's conversation.
"""

from __future__ import annotations

import re
from itertools import combinations
from typing import Protocol

from django.contrib.postgres.search import SearchQuery, SearchRank, SearchVector
from django.db import connection
from django.db.models import F

from documents.models import Passage

FTS_TABLE = "documents_passage_fts"
SEARCH_CONFIG = "english"
MAX_TERMS = 12  # a question's first 12 words: 66 pairs at most
MAX_RANKED = 300  # PostgreSQL: matching passages ranked per query (PostgresFullTextSearch)
WORD = re.compile(r"[^\W_]+")
# Words too common to tell passages apart; leaving them out keeps a question's matches few.
COMMON_WORDS = frozenset(
    [
        "a",
        "about",
        "after",
        "all",
        "also",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "because",
        "been",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "for",
        "from",
        "had",
        "has",
        "have",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "me",
        "my",
        "no",
        "not",
        "of",
        "on",
        "or",
        "our",
        "she",
        "should",
        "so",
        "some",
        "such",
        "than",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
    ]
)


def query_terms(question: str) -> list[str]:
    """The distinct searchable words of a question, in order, lower-cased."""
    terms = dict.fromkeys(word for word in WORD.findall(question.lower()) if word not in COMMON_WORDS)
    return list(terms)[:MAX_TERMS]


# Terms ANDed within each tuple, the tuples ORed.
Clauses = list[tuple[str, ...]]


class PassageSearch(Protocol):
    def index(self, document_id: int) -> None:
        """Make a new document's passages searchable."""
        ...

    def ranked(self, document_ids: list[int], clauses: Clauses, limit: int) -> list[int]:
        """The ids of the best passages of these documents matching any clause, best first."""
        ...


def passages_search(document_ids: list[int], terms: list[str], limit: int) -> list[int]:
    """The ids of the best passages of these documents for a question's terms, best first."""
    if not document_ids or not terms:
        return []
    search = passage_search()
    if len(terms) > 1 and (found := search.ranked(document_ids, list(combinations(terms, 2)), limit)):
        return found
    return search.ranked(document_ids, [(term,) for term in terms], limit)


class SqliteFts5Search:
    def index(self, document_id: int) -> None:
        pass  # the FTS5 table's triggers index each passage as it is inserted

    def ranked(self, document_ids: list[int], clauses: Clauses, limit: int) -> list[int]:
        # Each term quoted: FTS5 then reads it as a word (stemmed), never as query syntax.
        match = " OR ".join("(" + " AND ".join(f'"{term}"' for term in clause) + ")" for clause in clauses)
        placeholders = ", ".join(["%s"] * len(document_ids))
        sql = (
            f"SELECT p.id FROM {FTS_TABLE} JOIN documents_passage p ON p.id = {FTS_TABLE}.rowid "
            f"WHERE {FTS_TABLE} MATCH %s AND p.document_id IN ({placeholders}) "
            f"ORDER BY bm25({FTS_TABLE}, 2.0, 1.0) LIMIT %s"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [match, *document_ids, limit])
            return [row[0] for row in cursor.fetchall()]


class PostgresFullTextSearch:
    def index(self, document_id: int) -> None:
        vector = SearchVector("heading", weight="A", config=SEARCH_CONFIG) + SearchVector(
            "text", weight="B", config=SEARCH_CONFIG
        )
        Passage.objects.filter(document_id=document_id).update(search=vector)

    def ranked(self, document_ids: list[int], clauses: Clauses, limit: int) -> list[int]:
        # "raw" is to_tsquery: the terms are bare words (WORD), joined by its operators.
        raw = " | ".join("(" + " & ".join(clause) + ")" for clause in clauses)
        query = SearchQuery(raw, search_type="raw", config=SEARCH_CONFIG)
        # ts_rank_cd reads each row's tsvector: rank at most MAX_RANKED of the matches. Only
        # a question whose words are all common in the documents matches more, and then
        # its words say little about which passage is better anyway.
        # Unordered, so that the scan stops at the limit (the model's ordering would sort them all).
        matching = Passage.objects.filter(document_id__in=document_ids, search=query).order_by()
        candidates = matching.values("id")[:MAX_RANKED]
        found = (
            Passage.objects.filter(id__in=candidates)
            .annotate(rank=SearchRank(F("search"), query, cover_density=True))
            .order_by("-rank", "id")
            .values_list("id", flat=True)[:limit]
        )
        return list(found)


def passage_search() -> PassageSearch:
    """The search backend of the database in use."""
    if connection.vendor == "postgresql":
        return PostgresFullTextSearch()
    if connection.vendor == "sqlite":
        return SqliteFts5Search()
    raise NotImplementedError(f"Document search supports SQLite and PostgreSQL, not {connection.vendor}.")
