"""What the documents panel shows: one place for the page, the fragment and the tag."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth.models import User
from django.db.models import Count

from documents.models import Document
from documents.services import document_limits
from documents.vectors import passage_embedder


def documents_panel_context(*, user: User, conversation_id: uuid.UUID, error: str | None = None) -> dict[str, Any]:
    limits = document_limits(user)
    documents = list(
        Document.objects.filter(conversation_id=conversation_id, user=user).annotate(
            passage_count=Count("passages"), vector_count=Count("passages__vector")
        )
    )
    # Passages still waiting for their vectors (a big file, embedded in the background):
    # the panel says how far it got, and asks again until it is done.
    embedding = passage_embedder() is not None
    for document in documents:
        document.indexing = embedding and document.vector_count < document.passage_count  # type: ignore[attr-defined]
    return {
        "conversation_id": conversation_id,
        "documents": documents,
        "limits": limits,
        "document_error": error,
        "room_left": len(documents) < limits.max_documents,
        "indexing": any(document.indexing for document in documents),  # type: ignore[attr-defined]
    }
