"""Share links' pages: Share and Update link on a conversation, the shared page at
/s/<token>/, Continue this chat, and revoking a link under Your data (generation/sharing.py)."""

from __future__ import annotations

from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from accounts.services import account_for
from generation import services, sharing
from generation.models import Conversation, SharedLink
from generation.views import HtmxHttpRequest


@login_required
@require_POST
def conversation_share(request: HtmxHttpRequest, conversation_id: UUID) -> HttpResponse:
    """Share: make the conversation's link (or show the one it has); `update` takes a new
    snapshot of the branch shown under the same link."""
    found = get_object_or_404(Conversation, id=conversation_id, user=request.user)
    try:
        link = sharing.shared_link_publish(conversation=found, update="update" in request.POST)
    except sharing.SharingOff:
        return HttpResponse("Sharing is turned off on this site.\n", status=403, content_type="text/plain")
    if not request.htmx:
        return redirect(found)
    context = {"conversation": found, "just_shared": True, **sharing.share_panel_context(found, link)}
    return render(request, "generation/_share.html", context)


@login_required
@require_POST
def shared_link_revoke(request: HtmxHttpRequest, link_id: int) -> HttpResponse:
    """Stop sharing: the link answers 404 from now on. From Your data or the conversation."""
    link = get_object_or_404(SharedLink, pk=link_id, conversation__user=request.user)
    conversation = link.conversation
    sharing.shared_link_revoke(link=link)
    if request.htmx and request.POST.get("from") == "conversation":
        return render(request, "generation/_share.html", {"conversation": conversation, "shared_link": None})
    if request.POST.get("from") == "conversation":
        return redirect(conversation)
    return redirect("generation:your_data")


@require_GET
def shared_conversation(request: HttpRequest, token: str) -> HttpResponse:
    """The shared snapshot, readable without JavaScript and kept out of search engines.
    With CHAT_SHARING=users a visitor who is not logged in is sent to log in first."""
    link = sharing.shared_link_open(token=token, viewer=request.user)
    if link is None:
        well_formed = sharing.TOKEN_PATTERN.fullmatch(token) is not None
        if well_formed and sharing.login_needed(request.user):
            return redirect_to_login(request.get_full_path())
        raise Http404("No such shared conversation.")
    response = render(
        request, "generation/shared.html", {"link": link, "is_owner": link.conversation.user_id == request.user.pk}
    )
    response["X-Robots-Tag"] = "noindex, nofollow"
    # A link in an answer must not carry the address, token and all, to its site. (Not
    # no-referrer: Chromium then sends "Origin: null" with Continue this chat, which CSRF refuses.)
    response["Referrer-Policy"] = "same-origin"
    response["Cache-Control"] = "private, no-cache"  # a revoked link is gone at once
    return response


@login_required
@require_POST
def shared_conversation_continue(request: HtmxHttpRequest, token: str) -> HttpResponse:
    """Continue this chat: the snapshot becomes a new conversation of the viewer's."""
    link = sharing.shared_link_open(token=token, viewer=request.user)
    if link is None:
        raise Http404("No such shared conversation.")
    limit = account_for(request.user).limits.max_tokens_per_request
    models = services.models_to_choose(request.user)
    copy = sharing.shared_link_continue(link=link, user=request.user, models=models, max_tokens=limit)
    return redirect(copy)
