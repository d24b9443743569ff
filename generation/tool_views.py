"""The conversation settings' tool list: which tools of the MCP tool servers (tools/) a
conversation lets its model call. Only a model server's model can call them."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from generation.backends.router import backend
from generation.models import Conversation, Message
from generation.views import HtmxHttpRequest
from tools.forms import ConversationToolsForm, ToolCallDecisionForm
from tools.models import ConversationTool
from tools.services import conversation_tool_keys, conversation_tools_set, tool_call_decide, tools_offered


def tools_unavailable_reason(model: str) -> str:
    """Why `model` cannot call tools, or "" when it can."""
    if "tools" in backend().features(model):
        return ""
    return (
        f"{model} runs on this site's own engine, which cannot call tools. "
        "Choose a model served by a model server to use them."
    )


def chat_tools_context(
    conversation: Conversation, *, form: ConversationToolsForm | None = None, saved: bool = False
) -> dict[str, Any]:
    """What the tool list shows: the offered tools (those switched on checked), why they
    cannot be used with the conversation's model, and servers that could not be listed."""
    offered, problems = tools_offered(user=conversation.user)
    if form is None:
        ask = conversation_tool_keys(conversation=conversation, approval=ConversationTool.Approval.ASK)
        initial = {"tools": sorted(conversation_tool_keys(conversation=conversation)), "ask": sorted(ask)}
        form = ConversationToolsForm(offered=offered, initial=initial)
    return {
        "conversation": conversation,
        "tools_form": form,
        "tools_offered": offered,
        "tools_problems": problems,
        "tools_unavailable": tools_unavailable_reason(conversation.model),
        "tools_saved": saved,
    }


@login_required
@require_POST
def conversation_tools(request: HtmxHttpRequest, conversation_id: UUID) -> HttpResponse:
    """Save which tools the conversation's next answers may call."""
    found = get_object_or_404(Conversation, id=conversation_id, user=request.user)
    offered, _ = tools_offered(user=request.user)
    form = ConversationToolsForm(request.POST, offered=offered)
    if not form.is_valid():
        context = chat_tools_context(found, form=form)
        return render(request, "tools/_conversation_tools.html", context, status=422 if request.htmx else 400)
    chosen = form.cleaned_data
    conversation_tools_set(conversation=found, keys=set(chosen["tools"]), ask=set(chosen["ask"]), offered=offered)
    if not request.htmx:
        return redirect(found)
    return render(request, "tools/_conversation_tools.html", chat_tools_context(found, saved=True))


@login_required
@require_POST
def tool_call_decision(request: HtmxHttpRequest, message_id: int) -> HttpResponse:
    """Approve or deny a tool call of a streaming answer that waits for it."""
    answer = get_object_or_404(
        Message,
        pk=message_id,
        conversation__user=request.user,
        role=Message.Role.ASSISTANT,
        status=Message.Status.STREAMING,
    )
    form = ToolCallDecisionForm(request.POST)
    if not form.is_valid():
        return HttpResponse("Say which call, and approve or deny.\n", status=400, content_type="text/plain")
    decided = form.cleaned_data
    tool_call_decide(message_id=answer.pk, call_id=decided["call_id"], approved=decided["decision"] == "approve")
    return HttpResponse(status=204)
