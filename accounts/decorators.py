"""View decorators of the guest sandbox (CHAT_GUEST)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any, TypeVar, cast

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import render

from accounts.services import user_is_guest

View = TypeVar("View", bound=Callable[..., Any])


def members_only(view: View) -> View:
    """Refuse guests with a 403 page that says why and how to sign up (API keys, documents).

    Under @login_required: an anonymous request has been sent to log in already.
    """
    if iscoroutinefunction(view):

        @wraps(view)
        async def refuse_guests_async(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if await sync_to_async(user_is_guest)(await request.auser()):
                return await sync_to_async(guest_refused)(request)
            return await cast(Callable[..., Awaitable[HttpResponseBase]], view)(request, *args, **kwargs)

        return cast(View, refuse_guests_async)

    @wraps(view)
    def refuse_guests(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if user_is_guest(request.user):
            return guest_refused(request)
        return cast(HttpResponseBase, view(request, *args, **kwargs))

    return cast(View, refuse_guests)


def guests_enabled(view: View) -> View:
    """404 unless CHAT_GUEST is on, whatever the method: the sandbox's door does not exist."""

    @wraps(view)
    def when_enabled(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not settings.CHAT_GUEST:
            raise Http404("Guests are not enabled on this site.")
        return cast(HttpResponseBase, view(request, *args, **kwargs))

    return cast(View, when_enabled)


def guest_refused(request: HttpRequest) -> HttpResponse:
    return render(request, "accounts/guest_refused.html", status=403)
