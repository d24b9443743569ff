from __future__ import annotations

import asyncio
import uuid

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.db.models import Model
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST
from django_htmx.middleware import HtmxDetails

from accounts.decorators import members_only
from documents import services
from documents.extraction import UnreadableDocument, text_of
from documents.forms import DocumentUploadForm
from documents.models import Document, Passage
from documents.selectors import documents_panel_context

# The chat's Conversation, reached through the foreign key: documents never import the chat app.
Conversation: type[Model] = Document._meta.get_field("conversation").related_model  # type: ignore[assignment]


class HtmxHttpRequest(HttpRequest):
    """A request through HtmxMiddleware."""

    htmx: HtmxDetails


@login_required
@members_only
@require_POST
async def document_upload(request: HtmxHttpRequest, conversation_id: uuid.UUID) -> HttpResponse:
    """Attach a file to one of your conversations; the documents panel comes back, with
    what went wrong if it did (and the conversation's documents as they were)."""
    user = await request.auser()
    assert isinstance(user, User)
    if not await Conversation._default_manager.filter(id=conversation_id, user=user).aexists():
        raise Http404("No such conversation.")
    form = DocumentUploadForm(request.POST, request.FILES)
    if not form.is_valid():
        return await _refused(request, user, conversation_id, " ".join(str(error) for error in form.errors["file"]))
    upload = form.cleaned_data["file"]
    name = upload.name or "document"
    try:
        kind = await sync_to_async(services.document_check)(
            user=user, conversation_id=conversation_id, name=name, size=upload.size
        )
        # Reading a PDF is CPU work on untrusted input: off the event loop, and off the one
        # thread that every synchronous view shares.
        text = await asyncio.to_thread(text_of, name, kind, upload.read())
        await sync_to_async(services.document_add)(
            user=user, conversation_id=conversation_id, name=name, kind=kind, size=upload.size, text=text
        )
    except UnreadableDocument as error:
        return await _refused(request, user, conversation_id, str(error))
    if not request.htmx:
        return redirect("generation:conversation", conversation_id)
    return await sync_to_async(_panel)(request, user, conversation_id)


@login_required
@require_POST
def document_delete(request: HtmxHttpRequest, document_id: int) -> HttpResponse:
    document = get_object_or_404(Document, pk=document_id, user=request.user)
    conversation_id = document.conversation_id
    services.document_delete(document=document)
    if not request.htmx:
        return redirect("generation:conversation", conversation_id)
    assert isinstance(request.user, User)
    return _panel(request, request.user, conversation_id)


@login_required
@require_GET
def documents_panel(request: HtmxHttpRequest, conversation_id: uuid.UUID) -> HttpResponse:
    """The documents panel of one of your conversations (it asks for itself while indexing)."""
    get_object_or_404(Conversation, id=conversation_id, user=request.user)
    assert isinstance(request.user, User)
    return _panel(request, request.user, conversation_id)


@login_required
@require_GET
def passage(request: HtmxHttpRequest, passage_id: int) -> HttpResponse:
    """One passage of your documents, as an answer cites it."""
    found = get_object_or_404(Passage.objects.select_related("document"), pk=passage_id, document__user=request.user)
    return render(request, "documents/passage.html", {"passage": found, "document": found.document})


def _panel(
    request: HtmxHttpRequest, user: User, conversation_id: uuid.UUID, error: str | None = None, status: int = 200
) -> HttpResponse:
    context = documents_panel_context(user=user, conversation_id=conversation_id, error=error)
    return render(request, "documents/_documents.html", context, status=status)


async def _refused(request: HtmxHttpRequest, user: User, conversation_id: uuid.UUID, error: str) -> HttpResponse:
    """The panel with the reason a file was refused: 422, which htmx swaps in; without
    JavaScript a small page that says it, 400."""
    if request.htmx:
        return await sync_to_async(_panel)(request, user, conversation_id, error, 422)
    context = {"error": error, "conversation_id": conversation_id}
    return await sync_to_async(render)(request, "documents/refused.html", context, status=400)
