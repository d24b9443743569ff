"""What the documents panel shows: one place for the page, the fragment and the tag."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth.models import User

from documents.models import Document
from documents.services import document_limits


def documents_panel_context(*, user: User, conversation_id: uuid.UUID, error: str | None = None) -> dict[str, Any]:
    limits = document_limits(user)
    documents = list(Document.objects.filter(conversation_id=conversation_id, user=user))
    return {
        "conversation_id": conversation_id,
        "documents": documents,
        "limits": limits,
        "document_error": error,
        "room_left": len(documents) < limits.max_documents,
    }
