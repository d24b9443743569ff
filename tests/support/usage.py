"""Usage records made directly, for the tests of what is counted and shown."""

from __future__ import annotations

import datetime as dt
import uuid

from django.utils import timezone

from accounts.models import UsageRecord


def usage(user, *, day: dt.date | None = None, prompt: int = 0, completion: int = 0, **fields) -> UsageRecord:
    when = timezone.now() if day is None else dt.datetime.combine(day, dt.time(12), tzinfo=dt.UTC)
    fields = {"channel": "api", "model": "synthetic", "status": "complete", **fields}
    return UsageRecord.objects.create(
        user=user,
        stream_id=fields.pop("stream_id", uuid.uuid4().hex),
        prompt_tokens=prompt,
        completion_tokens=completion,
        created_at=when,
        **fields,
    )
