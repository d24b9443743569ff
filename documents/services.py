"""Writes of documents, and the retrieval step of an answer's prompt."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.template.defaultfilters import filesizeformat

from accounts.services import account_for
from documents.extraction import UnreadableDocument, kind_of
from documents.models import Document, Passage
from documents.passages import passages_of
from documents.search import passage_search, passages_search, query_terms
from documents.vectors import INLINE_PASSAGES, document_embed_later, passage_embedder, passages_embed, vector_search
from inference.embedding import EmbeddingFailed, reciprocal_rank_fusion

# Passages a prompt carries: enough to answer from, few enough to leave the model room.
RETRIEVED_PASSAGES = 4
# Candidates each ranking (words, meaning) gives the fusion; RRF's usual constant.
RANKED_CANDIDATES = 20
RRF_K = 60

logger = logging.getLogger(__name__)
EXCERPT_CHARS = 160

CITE_INSTRUCTION = (
    "Answer the question below from these numbered passages of the user's documents. "
    "Cite each passage you use by its number in square brackets, like [1] or [2]. "
    "If the passages do not hold the answer, say so."
)


@dataclass(frozen=True)
class DocumentLimits:
    """What a user's plan allows each conversation: how many files, and how big each."""

    max_documents: int
    max_bytes: int


def document_limits(user: User) -> DocumentLimits:
    plan = account_for(user).plan
    # No upload can be bigger than a request body may be (chatsite.body_limit).
    body_limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE or plan.max_document_bytes
    return DocumentLimits(plan.max_documents_per_conversation, min(plan.max_document_bytes, body_limit))


def document_check(*, user: User, conversation_id: uuid.UUID, name: str, size: int) -> str:
    """The kind of a file about to be attached, or UnreadableDocument saying why it can't be:
    the checks that need no reading of it (its name, its size, the conversation's count)."""
    kind = kind_of(name)
    limits = document_limits(user)
    if size > limits.max_bytes:
        allowed = filesizeformat(limits.max_bytes)
        raise UnreadableDocument(f"{name} is {filesizeformat(size)}; your plan allows {allowed} a file.")
    if Document.objects.filter(conversation_id=conversation_id).count() >= limits.max_documents:
        raise UnreadableDocument(
            f"This conversation already has {limits.max_documents} documents, the most your plan allows; "
            "remove one first."
        )
    return kind


def document_add(*, user: User, conversation_id: uuid.UUID, name: str, kind: str, size: int, text: str) -> Document:
    """Attach a file's text to a conversation, as searchable passages.

    The count is checked again under a lock on the owner's row, so that uploads racing
    each other cannot pass the plan's limit together. Its passages get their vectors
    (documents.vectors) once it is saved, outside that lock: at once when they are few and
    the embedding model is loaded, else in the background (the model's first load takes
    seconds); until then they are found by their words.
    """
    passages = passages_of(text)
    if not passages:
        raise UnreadableDocument(f"{name} has no text to search.")
    with transaction.atomic():
        User.objects.select_for_update().filter(pk=user.pk).first()
        document_check(user=user, conversation_id=conversation_id, name=name, size=size)
        document = Document.objects.create(
            conversation_id=conversation_id, user=user, name=name, kind=kind, size_bytes=size
        )
        Passage.objects.bulk_create(
            Passage(document=document, position=i, heading=p.heading, text=p.text) for i, p in enumerate(passages)
        )
        passage_search().index(document.pk)
    embedder = passage_embedder()
    if embedder is not None and embedder.loaded and len(passages) <= INLINE_PASSAGES:
        try:
            passages_embed(list(document.passages.values_list("pk", flat=True)), embedder)
        except EmbeddingFailed:  # found by its words meanwhile; `manage.py embed_passages` catches up
            logger.exception("Embedding the passages of %s failed", name)
    elif embedder is not None:
        transaction.on_commit(partial(document_embed_later, document.pk))
    return document


def document_delete(*, document: Document) -> None:
    """Remove a document; its passages leave the index with it, and answers keep their sources' text."""
    document.delete()


@dataclass(frozen=True)
class Retrieval:
    """What retrieval found for a question: the sources shown with the answer, and the
    prompt text that carries their passages, numbered as the sources are."""

    sources: list[dict[str, Any]]
    prompt: str


def retrieval_for(*, user: User, conversation_id: uuid.UUID, question: str) -> Retrieval | None:
    """The top passages of the conversation's documents for a question; None when it has no
    documents (its answers then run without a retrieval stage).

    Only documents of `user` in that conversation are searched, by words and by meaning:
    the full-text ranking and the ranking by similarity to the question's vector are fused
    by reciprocal rank (passages_find). With no passage found the question goes to the
    model as it was asked, and the sources are empty.
    """
    documents = Document.objects.filter(conversation_id=conversation_id, user=user)
    document_ids = list(documents.values_list("id", flat=True))
    if not document_ids:
        return None
    ids = passages_find(document_ids, question, RETRIEVED_PASSAGES)
    found = Passage.objects.select_related("document").in_bulk(ids)
    passages = [found[pk] for pk in ids if pk in found]
    if not passages:
        return Retrieval(sources=[], prompt=question)
    sources = [_source(number, passage) for number, passage in enumerate(passages, start=1)]
    numbered = "\n\n".join(
        f"[{number}] From {passage.document.name}"
        + (f", {passage.heading}" if passage.heading else "")
        + f":\n{passage.text}"
        for number, passage in enumerate(passages, start=1)
    )
    return Retrieval(sources=sources, prompt=f"{CITE_INSTRUCTION}\n\n{numbered}\n\nQuestion: {question}")


def passages_find(document_ids: list[int], question: str, limit: int) -> list[int]:
    """The ids of the best passages of these documents for a question, best first: the
    full-text ranking and the vector ranking, RANKED_CANDIDATES each, fused by reciprocal
    rank (k = RRF_K). Where no embedding model is installed, the full-text ranking alone;
    so too while it is not loaded yet (its load is begun: no question waits seconds for it)."""
    embedder = passage_embedder()
    if embedder is not None and not embedder.loaded:
        embedder.load_in_background()
        embedder = None
    try:
        # The question is embedded (on the embedder's thread) while its words are searched.
        embedding = embedder.submit(embedder.token_ids([question], truncate=True)) if embedder else None
        by_words = passages_search(document_ids, query_terms(question), RANKED_CANDIDATES)
        if embedder is None or embedding is None:
            return by_words[:limit]
        query = embedding.result().vectors[0]
    except EmbeddingFailed:  # a model that cannot load or run: answers keep their sources by words
        logger.exception("Embedding a question failed; retrieving by its words alone")
        return passages_search(document_ids, query_terms(question), limit)
    by_meaning = vector_search().ranked(document_ids, embedder.name, query, RANKED_CANDIDATES)
    return reciprocal_rank_fusion([by_words, by_meaning], k=RRF_K)[:limit]


def _source(number: int, passage: Passage) -> dict[str, Any]:
    """A source as the stream's `generating` event and the saved answer both carry it."""
    excerpt = passage.text if len(passage.text) <= EXCERPT_CHARS else passage.text[: EXCERPT_CHARS - 1] + "…"
    return {
        "number": number,
        "document": passage.document.name,
        "passage": passage.pk,
        "excerpt": excerpt,
        "url": passage.get_absolute_url(),
    }
