from __future__ import annotations

from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.middleware import HtmxDetails

from accounts.services import QuotaExceeded
from generation import runtime, services
from generation.engine import EngineOverloaded
from generation.forms import PromptForm
from generation.metrics import render_metrics
from generation.models import Conversation, Message

RETRY_AFTER_S = 5


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
    return _page(request, None, PromptForm())


@login_required
@require_http_methods(["GET", "POST"])
def conversation(request: HtmxHttpRequest, conversation_id: UUID) -> HttpResponse:
    found = get_object_or_404(Conversation, id=conversation_id, user=request.user)
    if request.method == "POST":
        return _send(request, found)
    return _page(request, found, PromptForm())


@login_required
@require_POST
def message_stop(request: HtmxHttpRequest, message_id: int) -> HttpResponse:
    """Stop a streaming answer; its stream then ends with the saved, stopped answer."""
    message = get_object_or_404(Message, pk=message_id, conversation__user=request.user, role=Message.Role.ASSISTANT)
    services.message_stop(message=message)
    if request.htmx:
        return HttpResponse(status=204)
    return redirect(message.conversation)


def _send(request: HtmxHttpRequest, conversation: Conversation | None) -> HttpResponse:
    form = PromptForm(request.POST)
    if not form.is_valid():
        return _refuse(request, conversation, form, status=422)
    is_new = conversation is None
    if conversation is None:
        conversation = services.conversation_create(user=request.user)
    try:
        prompt, answer = services.message_send(conversation=conversation, prompt=form.cleaned_data["prompt"])
    except (EngineOverloaded, QuotaExceeded) as refusal:
        if is_new:
            conversation.delete()
            conversation = None
        return _refuse_generation(request, conversation, form, refusal)
    if not request.htmx:
        return redirect(conversation)
    context = {"conversation": conversation, "messages": [prompt, answer], "form": PromptForm(), "is_new": is_new}
    response = render(request, "generation/_sent.html", context)
    if is_new:
        response["HX-Push-Url"] = conversation.get_absolute_url()
    return response


def _refuse_generation(
    request: HtmxHttpRequest,
    conversation: Conversation | None,
    form: PromptForm,
    refusal: EngineOverloaded | QuotaExceeded,
) -> HttpResponse:
    """Say in words why the answer could not start; the prompt stays in the box."""
    if isinstance(refusal, QuotaExceeded):
        form.add_error(None, f"{refusal.message} Try again in {_duration(refusal.retry_after)}.")
        status, retry_after = 429, refusal.retry_after
    else:
        form.add_error(None, "The server is busy right now. Try again in a moment.")
        status, retry_after = 503, RETRY_AFTER_S
    response = _refuse(request, conversation, form, status=status)
    response["Retry-After"] = str(retry_after)
    return response


def _duration(seconds: int) -> str:
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{round(seconds / 3600)} h"


def _refuse(
    request: HtmxHttpRequest, conversation: Conversation | None, form: PromptForm, *, status: int
) -> HttpResponse:
    if request.htmx:
        response = render(request, "generation/_composer.html", {"conversation": conversation, "form": form})
        response["HX-Retarget"] = "#composer"
        response["HX-Reswap"] = "outerHTML"
        response.status_code = status
        return response
    response = _page(request, conversation, form)
    response.status_code = status
    return response


def _page(request: HtmxHttpRequest, conversation: Conversation | None, form: PromptForm) -> HttpResponse:
    context: dict[str, Any] = {
        "conversation": conversation,
        "conversations": request.user.conversations.only("id", "title", "updated_at")[:100],
        "messages": conversation.messages.all() if conversation else [],
        "form": form,
    }
    return render(request, "generation/chat.html", context)


@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    """The process is up."""
    return JsonResponse({"status": "ok"})


@require_GET
@never_cache
def readyz(request: HttpRequest) -> HttpResponse:
    """Ready to serve: model loaded, database (and Redis when configured) reachable."""
    checks: dict[str, str] = {}
    engine = runtime.engine()
    checks["model"] = "ok" if engine.ready else (engine.load_error or "loading")
    checks["database"] = _check(lambda: connection.ensure_connection())
    if settings.REDIS_URL:
        checks["redis"] = _check(_ping_redis)
    ready = all(value == "ok" for value in checks.values())
    return JsonResponse({"status": "ok" if ready else "unavailable", "checks": checks}, status=200 if ready else 503)


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus metrics."""
    return HttpResponse(render_metrics(), content_type="text/plain; version=0.0.4; charset=utf-8")


def _check(probe: Any) -> str:
    try:
        probe()
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return "ok"


def _ping_redis() -> None:
    import redis

    assert settings.REDIS_URL
    redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1).ping()
