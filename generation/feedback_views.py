"""👍 / 👎 under a finished answer, with an optional reason and comment (generation/feedback.py)."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from generation.feedback import CannotRate, feedback_set
from generation.forms import FeedbackForm
from generation.models import Message
from generation.views import HtmxHttpRequest


@require_POST
def message_feedback(request: HtmxHttpRequest, message_id: int) -> HttpResponse:
    """Rate one of one's answers, or change its rating; HTMX gets the controls back, as saved."""
    if not request.user.is_authenticated:
        # Not login_required's redirect: the rating would be lost on the way, and HTMX would
        # put the log-in page where the buttons were.
        return _plain("Log in to rate answers.", status=403)
    answer = get_object_or_404(
        Message.objects.select_related("conversation", "feedback"),
        pk=message_id,
        conversation__user=request.user,
        role=Message.Role.ASSISTANT,
    )
    form = FeedbackForm(request.POST, answer=answer)
    if not form.is_valid():
        if request.htmx:
            return render(request, "generation/_feedback.html", {"message": answer, "form": form}, status=422)
        return _plain(next(str(error) for errors in form.errors.values() for error in errors), status=400)
    try:
        feedback_set(message=answer, **form.cleaned_data)
    except CannotRate as error:
        return _plain(str(error), status=409)
    if not request.htmx:
        return redirect(f"{answer.conversation.get_absolute_url()}#message-{answer.pk}")
    context = {"message": answer, "form": FeedbackForm(answer=answer), "saved": True}
    return render(request, "generation/_feedback.html", context)


def _plain(text: str, *, status: int) -> HttpResponse:
    return HttpResponse(text + "\n", status=status, content_type="text/plain; charset=utf-8")
