from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.db.models import F
from django.forms.models import model_to_dict
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect, push_url, reswap, retarget
from django_htmx.middleware import HtmxDetails

from accounts.decorators import members_only
from accounts.services import account_for, quota_for
from audit.models import AuditRecord
from audit.services import audit_record, target_of
from generation import connection_limits, search, services, sharing, transfer
from generation.backends import runtime
from generation.backends.reaping import message_mark_interrupted
from generation.connection_limits import TooManyConnections
from generation.forms import (
    CONVERSATIONS_PER_PAGE,
    ArchivedPageForm,
    ConversationArchiveForm,
    ConversationImportForm,
    ConversationPageForm,
    ConversationPinForm,
    ConversationRenameForm,
    ConversationSettingsForm,
    PromptForm,
    SearchForm,
)
from generation.models import Conversation, Message
from generation.refusals import REFUSALS, UNREACHABLE, Refusal, refusal_of
from generation.selectors import MessageTree, Versions, conversation_spend, with_costs
from inference.streams import StreamEvent, StreamNotFound, coalesced
from infrastructure import sse

# Ask EventSource to reconnect after 1 s (instead of its default 3 s) when a connection drops.
RECONNECT_PREAMBLE = b"retry: 1000\n\n"
# The answer events the page handles itself; the terminal one is rendered here.
BROWSER_EVENTS = frozenset({"status", "token", "tool_start", "tool_result"})

logger = logging.getLogger(__name__)


class HtmxHttpRequest(HttpRequest):
    """A request through HtmxMiddleware to a login_required view."""

    htmx: HtmxDetails
    user: User


@login_required
@require_http_methods(["GET", "POST"])
def chat(request: HtmxHttpRequest) -> HttpResponse:
    """A new, empty chat; its first prompt creates the conversation."""
    if request.method == "POST":
        return _send(request, None)
    return _page(request, None, PromptForm(), {"settings_form": _new_chat_settings_form(request)})


@login_required
@require_http_methods(["GET", "POST"])
def conversation(request: HtmxHttpRequest, conversation_id: UUID) -> HttpResponse:
    found = get_object_or_404(Conversation, id=conversation_id, user=request.user)
    if request.method == "POST":
        return _send(request, found)
    return _page(request, found, PromptForm())


@login_required
@require_GET
def conversation_list(request: HtmxHttpRequest) -> HttpResponse:
    """A further page of the sidebar's conversations, newest first, ending in its own Show more."""
    form = ConversationPageForm(request.GET)
    if not form.is_valid():
        return HttpResponse(_first_error(form), status=400, content_type="text/plain; charset=utf-8")
    page = form.cleaned_data["page"]
    conversations, more = _conversation_page(request.user, page)
    if not conversations:
        return HttpResponse("There is no such page of conversations.\n", status=404, content_type="text/plain")
    context = {"conversations": conversations, "next_page": page + 1 if more else None}
    if request.htmx:
        return render(request, "generation/_conversation_page.html", context)
    return _page(request, None, PromptForm(), context)


@login_required
@require_GET
def conversation_search(request: HtmxHttpRequest) -> HttpResponse:
    """The user's own conversations whose title or messages contain the words searched for."""
    form = SearchForm(request.GET)
    context: dict[str, Any] = {"search_form": form, "hits": []}
    status = 200
    if not form.is_valid():
        status = 422 if request.htmx else 400
    elif form.cleaned_data["q"]:
        try:
            context["hits"] = search.conversation_search(
                user=request.user,
                terms=search.search_terms(form.cleaned_data["q"]),
                include_archived=form.cleaned_data["archived"],
            )
        except search.SearchUnavailable as error:
            context["search_error"], status = str(error), 503
    if request.htmx:
        return render(request, "generation/_search_results.html", context, status=status)
    return _page(request, None, PromptForm(), context, status=status)


def _first_error(form: Any) -> str:
    return next(str(error) for errors in form.errors.values() for error in errors) + "\n"


@require_GET
async def answer_stream(request: HttpRequest, stream_id: str) -> HttpResponseBase:
    """One answer's SSE stream, for its owner: `status` and `token` events, each with `id:`
    its sequence number (consecutive tokens coalesced: the last one's), then one `done`
    carrying the saved answer's HTML, which the page swaps in.

    `Last-Event-ID` or `?after=` resumes after that event. The generation runs on when the
    reader goes away (a reload resumes it).
    """
    user = await request.auser()
    if not user.is_authenticated:
        return HttpResponse("Log in to read this stream.\n", status=403, content_type="text/plain; charset=utf-8")
    message = await Message.objects.filter(stream_id=stream_id, conversation__user=user).afirst()
    if message is None:
        return HttpResponse("No such stream.\n", status=404, content_type="text/plain; charset=utf-8")
    try:
        after = sse.resume_point(request)
    except ValueError:
        return HttpResponse(sse.RESUME_POINT_ERROR + "\n", status=400, content_type="text/plain; charset=utf-8")
    try:
        held = connection_limits.streams.hold(user.pk)
    except TooManyConnections as error:
        return _too_many_streams(refusal_of(error))
    return sse.response(connection_limits.held_open(held, _answer_chunks(message, after)))


def _too_many_streams(refusal: Refusal) -> HttpResponse:
    # EventSource gives up on a status other than 200; the page's SSE extension then opens
    # it again after a growing delay (0.5 s doubling to a minute), so the answer shows up
    # once one of the user's other streams has ended.
    response = HttpResponse(refusal.words + "\n", status=429, content_type="text/plain; charset=utf-8")
    response["Retry-After"] = str(refusal.retry_after)
    return response


async def _answer_chunks(message: Message, after: int) -> AsyncIterator[bytes]:
    yield RECONNECT_PREAMBLE
    store = runtime.stream_store()
    try:
        async for batch in sse.read(store, message.stream_id or "", after):
            if not batch:
                if not await sync_to_async(store.producer_alive)(message.producer):
                    raise StreamNotFound(message.stream_id)  # its producer died: nothing more will come
                yield sse.PING
                continue
            body = answer_events(batch)
            if batch[-1].terminal:
                body += await _final_event(message.pk, batch[-1].seq)
            yield body
    except StreamNotFound:
        # The producer is gone (e.g. a restart): settle the answer as it was saved.
        settled = await sync_to_async(message_mark_interrupted)(message)
        yield await _final_event(settled.pk, None)
    except UNREACHABLE as error:
        # The stream store went away (a Redis restart). Ending the response, rather than
        # breaking it off, lets EventSource reconnect with Last-Event-ID and resume, or
        # get the saved answer once the store is back and has forgotten the stream.
        logger.warning("Stream %s lost its stream store: %s", message.stream_id, error)


def answer_events(events: list[StreamEvent]) -> bytes:
    """The status and token events as SSE, in order, one event per run of consecutive tokens."""
    return b"".join(
        sse.event(event.data, name=event.type, id=event.seq)
        for event in coalesced(events)
        if event.type in BROWSER_EVENTS
    )


async def _final_event(message_pk: int, seq: int | None) -> bytes:
    html = await sync_to_async(_message_html)(message_pk)
    return sse.event(html, name="done", id=seq)


def _message_html(message_pk: int) -> str:
    message = with_costs(Message.objects.select_related("conversation", "feedback")).get(pk=message_pk)
    versions = MessageTree(message.conversation).versions(message)
    return render_to_string("generation/_message.html", {"message": message, "versions": versions})


@login_required
@require_POST
def message_stop(request: HtmxHttpRequest, message_id: int) -> HttpResponse:
    """Stop a streaming answer; its stream then ends with the saved, stopped answer."""
    message = get_object_or_404(Message, pk=message_id, conversation__user=request.user, role=Message.Role.ASSISTANT)
    services.message_stop(message=message)
    if request.htmx:
        return HttpResponse(status=204)
    return redirect(message.conversation)


@login_required
@require_POST
def conversation_rename(request: HtmxHttpRequest, conversation_id: UUID) -> HttpResponse:
    found = get_object_or_404(Conversation, id=conversation_id, user=request.user)
    form = ConversationRenameForm(request.POST, instance=found)
    if form.is_valid():
        form.save()
        if not request.htmx:
            return redirect(found)
        return render(request, "generation/_renamed.html", _header_context(found))
    if request.htmx:
        context = {**_header_context(found), "rename_form": form}
        return render(request, "generation/_conversation_header.html", context, status=422)
    return _page(request, found, PromptForm(), {"rename_form": form}, status=400)


@login_required
@require_POST
def conversation_delete(request: HtmxHttpRequest, conversation_id: UUID) -> HttpResponse:
    """Delete a conversation with its messages; answers still streaming are stopped first."""
    found = get_object_or_404(Conversation, id=conversation_id, user=request.user)
    for answer in found.messages.filter(status=Message.Status.STREAMING):
        services.message_stop(message=answer)
    found.delete()
    if request.htmx:
        return HttpResponseClientRedirect(reverse("generation:chat"))
    return redirect("generation:chat")


@login_required
@require_POST
def conversation_pin(request: HtmxHttpRequest, conversation_id: UUID) -> HttpResponse:
    """Pin a conversation to the top of the sidebar (`pinned=true`), or unpin it."""
    found = get_object_or_404(Conversation, id=conversation_id, user=request.user)
    form = ConversationPinForm(request.POST)
    if not form.is_valid():
        return HttpResponse(_first_error(form), status=400, content_type="text/plain; charset=utf-8")
    services.conversation_pin(conversation=found, pinned=form.cleaned_data["pinned"])
    return _organized(request, found)


@login_required
@require_POST
def conversation_archive(request: HtmxHttpRequest, conversation_id: UUID) -> HttpResponse:
    """Archive a conversation (`archived=true`): it leaves the sidebar and stays open at its
    URL, answers included, until restored (`false`)."""
    found = get_object_or_404(Conversation, id=conversation_id, user=request.user)
    form = ConversationArchiveForm(request.POST)
    if not form.is_valid():
        return HttpResponse(_first_error(form), status=400, content_type="text/plain; charset=utf-8")
    services.conversation_archive(conversation=found, archived=form.cleaned_data["archived"])
    if form.cleaned_data["return_to"] != "archived":
        return _organized(request, found)
    if request.htmx:  # its row in the Archived list says where it went
        return render(request, "generation/_restored.html", {"conversation": found})
    return redirect("generation:archived")


def _organized(request: HtmxHttpRequest, conversation: Conversation) -> HttpResponse:
    """After a pin or an archive: for HTMX the conversation's header and, out of band, the
    sidebar's first page in its new order."""
    if not request.htmx:
        return redirect(conversation)
    conversations, more = _conversation_page(request.user, 1)
    context = {**_header_context(conversation), "conversations": conversations, "next_page": 2 if more else None}
    return render(request, "generation/_organized.html", context)


@login_required
@require_GET
def archived(request: HtmxHttpRequest) -> HttpResponse:
    """The user's archived conversations, most recently archived first, each with Unarchive."""
    form = ArchivedPageForm(request.GET)
    if not form.is_valid():
        return HttpResponse(_first_error(form), status=400, content_type="text/plain; charset=utf-8")
    page = form.cleaned_data["page"] or 1
    start = (page - 1) * CONVERSATIONS_PER_PAGE
    listed = request.user.conversations.filter(archived_at__isnull=False).order_by("-archived_at", "-updated_at")
    rows = list(listed.values("id", "title", "archived_at")[start : start + CONVERSATIONS_PER_PAGE + 1])
    if page > 1 and not rows:
        return HttpResponse("There is no such page of archived conversations.\n", status=404, content_type="text/plain")
    more = len(rows) > CONVERSATIONS_PER_PAGE
    context = {"conversations": rows[:CONVERSATIONS_PER_PAGE], "next_page": page + 1 if more else None}
    return render(request, "generation/archived.html", context)


@login_required
@require_GET
def conversation_export_markdown(request: HtmxHttpRequest, conversation_id: UUID) -> HttpResponse:
    """The branch shown, as Markdown to read."""
    found = get_object_or_404(Conversation, id=conversation_id, user=request.user)
    _export_recorded(request, f"{target_of(found)} as markdown")
    response = HttpResponse(transfer.conversation_markdown(found), content_type="text/markdown; charset=utf-8")
    return _attachment(response, transfer.download_name(found, "md"))


@login_required
@require_GET
def conversation_export_json(request: HtmxHttpRequest, conversation_id: UUID) -> HttpResponse:
    """The conversation with every branch, as JSON that the import takes back."""
    found = get_object_or_404(Conversation, id=conversation_id, user=request.user)
    _export_recorded(request, f"{target_of(found)} as json")
    return _attachment(_json_download(transfer.conversation_document(found)), transfer.download_name(found, "json"))


@login_required
@members_only  # its import would make a guest more conversations than the guest plan keeps
@require_http_methods(["GET", "POST"])
def your_data(request: HtmxHttpRequest) -> HttpResponse:
    """Export all of one's data; import a conversation exported as JSON (as a new one)."""
    posted = request.method == "POST"
    form = ConversationImportForm(request.POST, request.FILES) if posted else ConversationImportForm()
    if posted and form.is_valid():
        try:
            document = transfer.conversation_document_parse(form.cleaned_data["file"].read())
            limit = account_for(request.user).limits.max_tokens_per_request
            imported = transfer.conversation_import(
                user=request.user, document=document, models=services.models_to_choose(request.user), max_tokens=limit
            )
        except transfer.ImportRefused as refused:
            form.add_error("file", str(refused))
        else:
            return redirect(imported)
    context = {
        "import_form": form,
        "conversation_count": request.user.conversations.count(),
        "shared_links": sharing.shared_links_of(request.user),
    }
    return render(request, "generation/your_data.html", context, status=400 if form.errors else 200)


@login_required
@require_GET
def your_data_export(request: HtmxHttpRequest) -> HttpResponse:
    """Every conversation of the user, every branch, in one JSON download."""
    _export_recorded(request, f"{target_of(request.user, request.user.get_username())} all data as json")
    return _attachment(_json_download(transfer.user_document(request.user)), "chatsite-data.json")


def _export_recorded(request: HtmxHttpRequest, target: str) -> None:
    """What was exported, by id: never its content (a title is the user's text too)."""
    audit_record(action=AuditRecord.Action.EXPORT, target=target, request=request)


def _json_download(document: dict[str, Any]) -> HttpResponse:
    return JsonResponse(document, json_dumps_params={"ensure_ascii": False, "indent": 2})


def _attachment(response: HttpResponse, filename: str) -> HttpResponse:
    """A download; `filename` is plain (letters, digits, dashes, a dot): no quoting needed."""
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@login_required
@require_POST
def conversation_settings(request: HtmxHttpRequest, conversation_id: UUID) -> HttpResponse:
    """Save the model and sampling settings that the conversation's next answers use."""
    found = get_object_or_404(Conversation, id=conversation_id, user=request.user)
    form = _settings_form(request, found, data=request.POST)
    if form.is_valid():
        form.save()
        if not request.htmx:
            return redirect(found)
        context = {"conversation": found, "settings_form": _settings_form(request, found), "settings_saved": True}
        return render(request, "generation/_conversation_settings.html", context)
    if request.htmx:
        context = {"conversation": found, "settings_form": form}
        return render(request, "generation/_conversation_settings.html", context, status=422)
    return _page(request, found, PromptForm(), {"settings_form": form}, status=400)


@login_required
@require_POST
def message_regenerate(request: HtmxHttpRequest, message_id: int) -> HttpResponse:
    """A new version of an answer, shown in its place; the earlier one stays a click away."""
    answer = get_object_or_404(Message, pk=message_id, conversation__user=request.user, role=Message.Role.ASSISTANT)
    try:
        services.message_regenerate(answer=answer)
    except services.CannotRegenerate as error:
        return _message_refused(request, answer, Refusal(400, None, str(error), None))
    except REFUSALS as error:
        return _message_refused(request, answer, refusal_of(error))
    return _branch_shown(request, answer.conversation)


@login_required
@require_POST
def message_edit(request: HtmxHttpRequest, message_id: int) -> HttpResponse:
    """Ask an edited prompt as a new version of it; the earlier prompt and its answers stay
    as another branch."""
    prompt = get_object_or_404(Message, pk=message_id, conversation__user=request.user, role=Message.Role.USER)
    form = PromptForm(request.POST)
    if not form.is_valid():
        error = " ".join(str(text) for text in form.errors.get("prompt", []))
        invalid = Refusal(400, None, error, "prompt")
        return _message_refused(request, prompt, invalid, edited=form.data.get("prompt", ""))
    text = form.cleaned_data["prompt"]
    try:
        services.message_edit(prompt=prompt, content=text)
    except REFUSALS as error:
        return _message_refused(request, prompt, refusal_of(error), edited=text)
    return _branch_shown(request, prompt.conversation)


@login_required
@require_POST
def message_choose(request: HtmxHttpRequest, message_id: int) -> HttpResponse:
    """Show another version of a message (◀ ▶), and the branch that follows it."""
    message = get_object_or_404(Message, pk=message_id, conversation__user=request.user)
    services.message_choose(message=message)
    return _branch_shown(request, message.conversation)


def _branch_shown(request: HtmxHttpRequest, conversation: Conversation) -> HttpResponse:
    """The conversation's chosen branch after a change to it: its messages for HTMX (they
    replace the whole list, since what follows the changed message changes too)."""
    if not request.htmx:
        return redirect(conversation)
    context = {"thread": _thread(conversation), "quota": _quota_meter(request)}
    return render(request, "generation/_branch.html", context)


def _message_refused(
    request: HtmxHttpRequest, message: Message, refusal: Refusal, *, edited: str | None = None
) -> HttpResponse:
    """Show why a Regenerate or Edit did nothing, next to that message's controls."""
    context: dict[str, Any] = {"action_for": message.pk, "action_error": refusal.words}
    if edited is not None:
        context["edited"] = edited
    status = _page_status(request, refusal)
    if request.htmx:
        context |= {"thread": _thread(message.conversation), "quota": _quota_meter(request)}
        response = render(request, "generation/_branch.html", context, status=status)
    else:
        response = _page(request, message.conversation, PromptForm(), context, status=status)
    if refusal.retry_after is not None:
        response["Retry-After"] = str(refusal.retry_after)
    return response


def _page_status(request: HtmxHttpRequest, refusal: Refusal) -> int:
    """A refusal's status on a page: input it cannot take is 422 for HTMX, which swaps that in."""
    return 422 if refusal.status == 400 and request.htmx else refusal.status


def _send(request: HtmxHttpRequest, conversation: Conversation | None) -> HttpResponse:
    form = PromptForm(request.POST)
    is_new = conversation is None
    # A new conversation is saved only once its first answer is admitted: a refused send
    # leaves nothing behind for this user's other requests to trip over.
    new_settings = _new_chat_settings_form(request, request.POST) if is_new else None
    if not form.is_valid() or (new_settings is not None and not new_settings.is_valid()):
        return _refuse(request, conversation, form, status=422, settings_form=new_settings)
    sending = new_settings.instance if new_settings is not None else conversation
    assert sending is not None
    try:
        prompt, answer = services.message_send(conversation=sending, prompt=form.cleaned_data["prompt"])
    except REFUSALS as error:
        return _refuse_generation(request, conversation, form, refusal_of(error), settings_form=new_settings)
    conversation = sending
    if not request.htmx:
        return redirect(conversation)
    tree = MessageTree(conversation)
    context = {
        "conversation": conversation,
        "sent": [(message, tree.versions(message)) for message in (prompt, answer)],
        "form": PromptForm(),
        "is_new": is_new,
        "quota": _quota_meter(request),
    }
    if is_new:
        context |= _header_context(conversation)
        context["settings_form"] = _settings_form(request, conversation)
    response = render(request, "generation/_sent.html", context)
    return push_url(response, conversation.get_absolute_url()) if is_new else response


def _refuse_generation(
    request: HtmxHttpRequest,
    conversation: Conversation | None,
    form: PromptForm,
    refusal: Refusal,
    *,
    settings_form: ConversationSettingsForm | None = None,
) -> HttpResponse:
    """Say in words why the answer could not start; the prompt stays in the box."""
    form.add_error(None, refusal.words)
    status = _page_status(request, refusal)
    response = _refuse(request, conversation, form, status=status, settings_form=settings_form)
    if refusal.retry_after is not None:
        response["Retry-After"] = str(refusal.retry_after)
    return response


def _refuse(
    request: HtmxHttpRequest,
    conversation: Conversation | None,
    form: PromptForm,
    *,
    status: int,
    settings_form: ConversationSettingsForm | None = None,
) -> HttpResponse:
    """The prompt back in its box with what went wrong (and a new chat's settings as chosen)."""
    extra = {"settings_form": settings_form} if settings_form is not None else {}
    if request.htmx:
        context = {"conversation": conversation, "form": form, "quota": _quota_meter(request), **extra}
        response = render(request, "generation/_refused.html", context, status=status)
        return reswap(retarget(response, "#composer"), "outerHTML")
    return _page(request, conversation, form, extra, status=status)


def _page(
    request: HtmxHttpRequest,
    conversation: Conversation | None,
    form: PromptForm,
    extra: dict[str, Any] | None = None,
    *,
    status: int = 200,
) -> HttpResponse:
    conversations, more = _conversation_page(request.user, 1)
    context: dict[str, Any] = {
        "conversation": conversation,
        "conversations": conversations,
        "next_page": 2 if more else None,
        "search_form": SearchForm(),
        "thread": _thread(conversation) if conversation else [],
        "form": form,
        "quota": _quota_meter(request),
    }
    if conversation:
        context |= _header_context(conversation)
        context["settings_form"] = _settings_form(request, conversation)
    return render(request, "generation/chat.html", context | (extra or {}), status=status)


def _conversation_page(user: User, page: int) -> tuple[Sequence[Mapping[str, Any]], bool]:
    """One page of the user's conversations not archived, and whether more follow: the
    pinned first (newest pin first), then the rest, newest first.

    One query, rows as plain values: a conversation deleted meanwhile (say by a refused
    send in another tab) cannot make the page fetch it again."""
    start = (page - 1) * CONVERSATIONS_PER_PAGE
    listed = user.conversations.filter(archived_at__isnull=True).order_by(
        F("pinned_at").desc(nulls_last=True), "-updated_at"
    )
    rows = list(listed.values("id", "title", "pinned_at")[start : start + CONVERSATIONS_PER_PAGE + 1])
    return rows[:CONVERSATIONS_PER_PAGE], len(rows) > CONVERSATIONS_PER_PAGE


def _thread(conversation: Conversation) -> list[tuple[Message, Versions]]:
    """The chosen branch's messages, each with its versions (for "◀ 2/3 ▶")."""
    tree = MessageTree(conversation, costs=True)
    return [(message, tree.versions(message)) for message in tree.thread()]


def _header_context(conversation: Conversation) -> dict[str, Any]:
    return {
        "conversation": conversation,
        "rename_form": ConversationRenameForm(instance=conversation),
        "spend": conversation_spend(conversation),
        **sharing.share_panel_context(conversation),
    }


def _settings_form(request: HtmxHttpRequest, conversation: Conversation, data: Any = None) -> ConversationSettingsForm:
    limit = account_for(request.user).limits.max_tokens_per_request
    models = services.models_to_choose(request.user)
    return ConversationSettingsForm(data, instance=conversation, max_tokens_limit=limit, models=models)


def _new_chat_settings_form(request: HtmxHttpRequest, posted: Any = None) -> ConversationSettingsForm:
    """The settings of a chat not started yet: its fields belong to the composer's form, so
    the first prompt carries them and they apply from the first answer. A field not sent
    keeps its default."""
    conversation = services.conversation_new(user=request.user)
    # A plan that allows fewer tokens than the default starts there, not with an error.
    limit = account_for(request.user).limits.max_tokens_per_request
    conversation.max_tokens = min(conversation.max_tokens, limit)
    data = None
    if posted is not None:
        defaults = model_to_dict(conversation, fields=ConversationSettingsForm.Meta.fields)
        data = {name: posted.get(name, default) for name, default in defaults.items()}
    form = _settings_form(request, conversation, data)
    for field in form.fields.values():
        field.widget.attrs["form"] = "composer"
    return form


@dataclass(frozen=True)
class QuotaMeter:
    requests_left: int
    tokens_left: int


def _quota_meter(request: HtmxHttpRequest) -> QuotaMeter:
    quota = quota_for(request.user)
    return QuotaMeter(requests_left=max(0, quota.requests_remaining), tokens_left=quota.tokens_remaining)
