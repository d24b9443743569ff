"""Writes of the API's own: stored responses (POST /v1/responses with `store`)."""

from __future__ import annotations

import datetime
from typing import Any

from django.contrib.auth.models import User

from accounts.models import UsageRecord
from api.models import StoredResponse
from api.response_events import RESPONSE_PREFIX, ResponseHead, ResponseOutcome, failed, outcome_of
from generation.backends import runtime
from inference.streams import StreamNotFound

INTERRUPTED = "This response was interrupted (the server stopped); it will not be finished."
EXPIRED = "This response ended unread, and its answer has expired."


def stored_response_create(
    *, user: User, head: ResponseHead, context: list[dict[str, Any]], input: list[dict[str, Any]]
) -> StoredResponse:
    return StoredResponse.objects.create(
        id=head.id,
        user=user,
        stream_id=head.stream_id,
        model=head.model,
        instructions=head.instructions or "",
        context=context,
        input=input,
        params=head.params,
        previous_response_id=head.previous_response_id or "",
        created_at=datetime.datetime.fromtimestamp(head.created_at, tz=datetime.UTC),
    )


def stored_response_finish(*, response_id: str, outcome: ResponseOutcome) -> None:
    """Save a response's end, once: the first reader to see it saves it, the others change nothing."""
    if not outcome.finished:
        return
    completed_at = datetime.datetime.fromtimestamp(outcome.completed_at or 0, tz=datetime.UTC)
    StoredResponse.objects.filter(pk=response_id, status=StoredResponse.Status.IN_PROGRESS).update(
        status=outcome.status,
        output_text=outcome.text,
        usage=outcome.usage,
        error=outcome.error,
        incomplete_reason=outcome.incomplete_reason or "",
        completed_at=completed_at,
    )


def stored_response_get(*, user: User, response_id: str) -> StoredResponse | None:
    """The user's stored response, its end saved if its generation has ended meanwhile; None
    for another's, as for one that does not exist."""
    if not response_id.startswith(RESPONSE_PREFIX):
        return None
    response = StoredResponse.objects.filter(pk=response_id, user=user).first()
    if response is None or response.status != StoredResponse.Status.IN_PROGRESS:
        return response
    outcome = _outcome_now(response)
    if outcome.finished:
        stored_response_finish(response_id=response.id, outcome=outcome)
        response.refresh_from_db()
    return response


def stored_response_delete(*, user: User, response_id: str) -> StoredResponse | None:
    """Delete the user's stored response (a running generation goes on, unread); None if there is none."""
    response = StoredResponse.objects.filter(pk=response_id, user=user).first()
    if response is not None:
        response.delete()
    return response


def _outcome_now(response: StoredResponse) -> ResponseOutcome:
    """Where the response's generation stands, from the stream store while it keeps its events,
    else from the ledger: settled with no events left means it ended unread and expired, or its
    process stopped."""
    try:
        events = runtime.stream_store().events(response.stream_id)
        return outcome_of(events, created_at=int(response.created_at.timestamp()))
    except StreamNotFound:
        pass
    record = UsageRecord.objects.filter(stream_id=response.stream_id).first()
    if record is not None and record.status == UsageRecord.Status.STREAMING:
        return ResponseOutcome()  # queued, not begun
    ended = record is not None and record.status in (UsageRecord.Status.COMPLETE, UsageRecord.Status.STOPPED)
    return failed(ResponseOutcome(), "generation_failed", EXPIRED if ended else INTERRUPTED)
