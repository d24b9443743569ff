"""Passage vectors: embedding passages as they are indexed, and finding them by meaning.

Each passage gets a unit vector of the embedding model's (inference.embedding) in a
`PassageVector` row: float32 little-endian bytes on every database. Retrieval fuses the
full-text ranking with the ranking by cosine similarity to the question (documents.services).

One seam, `VectorSearch`, with a backend chosen by what the database offers:

- SQLite with `sqlite-vec` loaded (documents.apps loads it into each connection, where
  Python's sqlite3 allows extensions): `vec_distance_cosine` over the conversation's
  vectors, in SQL.
- PostgreSQL with the `pgvector` extension (the migration adds an `embedding vector`
  column when the extension can be created): `<=>` (cosine distance), in SQL.
- Otherwise (a Python built without extension loading, PostgreSQL without pgvector): an
  exact search in this process, one matrix product over the conversation's vectors, which
  stay in memory between questions while the conversation's documents and vectors are
  unchanged (`ExactVectorSearch`).

All three are exact: a conversation holds at most a few documents' passages (10,000 in
the benchmark), and every query is limited to that conversation's documents, so an
approximate index over all users' vectors would not help it.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import sqlite_vec
from django.conf import settings
from django.db import close_old_connections, connection
from django.db.backends.base.base import BaseDatabaseWrapper

from documents.models import Passage, PassageVector
from inference.embedding import (
    DEFAULT_EMBEDDING_MODEL,
    Embedder,
    Vectors,
    available_embedding_models,
    embedder_for,
    vector_bytes,
    vectors_of,
)

logger = logging.getLogger(__name__)

# Passages embedded a forward pass's worth at a time, and saved after each step (progress).
EMBED_STEP = 64
# A document of at most this many passages is embedded as it is added (under a second or
# two on a CPU); a bigger one in the background, its progress shown in the documents panel.
INLINE_PASSAGES = 32
# Vector hits less similar than this to the question are no hits: every question has
# nearest passages, but a question about nothing in the documents should find none.
MIN_SIMILARITY = 0.25


def passage_embedder() -> Embedder | None:
    """The embedding model of passages and questions; None where it is not installed (then
    retrieval is by words alone)."""
    if DEFAULT_EMBEDDING_MODEL not in available_embedding_models():
        return None
    return embedder_for(DEFAULT_EMBEDDING_MODEL, device=settings.CHAT_DEVICE)


def passages_embed(passage_ids: Sequence[int], embedder: Embedder) -> int:
    """Embed these passages (those still without a vector of `embedder`'s), EMBED_STEP at a
    time, each step saved; returns how many got one."""
    done = 0
    have = set(
        PassageVector.objects.filter(passage_id__in=passage_ids, model=embedder.name).values_list("pk", flat=True)
    )
    missing = [pk for pk in passage_ids if pk not in have]
    for start in range(0, len(missing), EMBED_STEP):
        step = list(
            Passage.objects.filter(pk__in=missing[start : start + EMBED_STEP]).values_list(
                "pk", "document_id", "heading", "text"
            )
        )
        embedded = embedder.embed([_embedded_text(heading, text) for _, _, heading, text in step], truncate=True)
        rows = [
            PassageVector(passage_id=pk, document_id=document_id, model=embedder.name, vector=vector_bytes(vector))
            for (pk, document_id, _, _), vector in zip(step, embedded.vectors, strict=True)
        ]
        PassageVector.objects.filter(pk__in=[row.pk for row in rows]).delete()  # another model's
        PassageVector.objects.bulk_create(rows)
        vector_search().stored(rows)
        done += len(rows)
    return done


def _embedded_text(heading: str, text: str) -> str:
    # The heading says what a passage is about, as it does for the full-text ranking.
    return f"{heading}\n{text}" if heading else text


def document_embed_later(document_id: int) -> threading.Thread:
    """Embed a document's passages in a thread of this process; its progress is the count of
    its passages with vectors (documents.selectors). A process that stops meanwhile leaves
    the rest to `manage.py embed_passages`."""
    thread = threading.Thread(
        target=_embed_in_background, args=(document_id,), name=f"embed-document-{document_id}", daemon=True
    )
    thread.start()
    return thread


def _embed_in_background(document_id: int) -> None:
    embedder = passage_embedder()
    try:
        if embedder is not None:
            ids = list(Passage.objects.filter(document_id=document_id).values_list("pk", flat=True))
            passages_embed(ids, embedder)
    except Exception:
        logger.exception("Embedding the passages of document %s failed", document_id)
    finally:
        close_old_connections()
        connection.close()


class VectorSearch(Protocol):
    def stored(self, rows: list[PassageVector]) -> None:
        """Index new vectors where the backend keeps its own copy."""
        ...

    def ranked(self, document_ids: list[int], model: str, query: Vectors, limit: int) -> list[int]:
        """The ids of these documents' passages most similar to `query` (at least
        MIN_SIMILARITY), most similar first."""
        ...


class ExactVectorSearch:
    """Cosine similarity over the conversation's vectors, in this process."""

    CACHED_CONVERSATIONS = 4
    _cache: OrderedDict[tuple[str, tuple[int, ...]], tuple[int, np.ndarray, Vectors]] = OrderedDict()
    _lock = threading.Lock()

    def stored(self, rows: list[PassageVector]) -> None:
        pass

    def ranked(self, document_ids: list[int], model: str, query: Vectors, limit: int) -> list[int]:
        ids, matrix = self._vectors(document_ids, model, len(query))
        if not len(ids):
            return []
        similarity = matrix @ query
        top = np.argsort(-similarity)[:limit]
        return [int(ids[i]) for i in top if similarity[i] >= MIN_SIMILARITY]

    def _vectors(self, document_ids: list[int], model: str, dimensions: int) -> tuple[np.ndarray, Vectors]:
        """The documents' passage ids and vectors; from memory while their count is unchanged
        (a document's vectors are only ever added to, and a removed one changes the ids)."""
        key = (model, tuple(sorted(document_ids)))
        rows = PassageVector.objects.filter(document_id__in=document_ids, model=model)
        count = rows.count()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and cached[0] == count:
                self._cache.move_to_end(key)
                return cached[1], cached[2]
        pairs = list(rows.order_by().values_list("pk", "vector"))
        ids = np.array([pk for pk, _ in pairs], dtype=np.int64)
        matrix = vectors_of([bytes(blob) for _, blob in pairs], dimensions)
        with self._lock:
            self._cache[key] = (len(pairs), ids, matrix)
            while len(self._cache) > self.CACHED_CONVERSATIONS:
                self._cache.popitem(last=False)
        return ids, matrix


class SqliteVecSearch:
    """sqlite-vec's cosine distance over the conversation's vector blobs."""

    def stored(self, rows: list[PassageVector]) -> None:
        pass

    def ranked(self, document_ids: list[int], model: str, query: Vectors, limit: int) -> list[int]:
        placeholders = ", ".join(["%s"] * len(document_ids))
        sql = (
            "SELECT passage_id, vec_distance_cosine(vector, %s) AS distance FROM documents_passagevector "
            f"WHERE model = %s AND document_id IN ({placeholders}) ORDER BY distance LIMIT %s"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [vector_bytes(query), model, *document_ids, limit])
            return [pk for pk, distance in cursor.fetchall() if 1 - distance >= MIN_SIMILARITY]


class PgvectorSearch:
    """pgvector's cosine distance (`<=>`) over the `embedding` column."""

    def stored(self, rows: list[PassageVector]) -> None:
        with connection.cursor() as cursor:
            cursor.executemany(
                "UPDATE documents_passagevector SET embedding = %s::vector WHERE passage_id = %s",
                [(_pgvector_text(vectors_of([bytes(row.vector)], len(row.vector) // 4)[0]), row.pk) for row in rows],
            )

    def ranked(self, document_ids: list[int], model: str, query: Vectors, limit: int) -> list[int]:
        sql = (
            "SELECT passage_id, embedding <=> %s::vector AS distance FROM documents_passagevector "
            "WHERE model = %s AND document_id = ANY(%s) AND embedding IS NOT NULL ORDER BY distance LIMIT %s"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [_pgvector_text(query), model, list(document_ids), limit])
            return [pk for pk, distance in cursor.fetchall() if 1 - distance >= MIN_SIMILARITY]


def _pgvector_text(vector: Vectors) -> str:
    return "[" + ",".join(f"{value:.7g}" for value in vector.tolist()) + "]"


def sqlite_vec_loadable() -> bool:
    """Whether this Python's sqlite3 can load extensions (many builds cannot: Python's own
    configure leaves it out unless asked, as pyenv's build here does)."""
    return hasattr(sqlite3.Connection, "enable_load_extension")


def sqlite_vec_load(*, sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """Load sqlite-vec into a new SQLite connection (the connection_created signal)."""
    if connection.vendor != "sqlite" or not sqlite_vec_loadable():
        return
    raw = connection.connection
    raw.enable_load_extension(True)
    try:
        sqlite_vec.load(raw)
    finally:
        raw.enable_load_extension(False)


_pgvector_columns: dict[str, bool] = {}


def _has_pgvector_column() -> bool:
    alias = connection.alias
    if alias not in _pgvector_columns:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT 1 FROM information_schema.columns "
                "WHERE table_name = 'documents_passagevector' AND column_name = 'embedding'"
            )
            _pgvector_columns[alias] = cursor.fetchone() is not None
    return _pgvector_columns[alias]


def vector_search() -> VectorSearch:
    """The vector search of the database in use."""
    if connection.vendor == "postgresql" and _has_pgvector_column():
        return PgvectorSearch()
    if connection.vendor == "sqlite" and sqlite_vec_loadable():
        return SqliteVecSearch()
    return ExactVectorSearch()
