"""Ratings of answers: 👍 or 👎 from the conversation's owner, with an optional reason and comment.

One rating per answer (Feedback), changed by rating again. Only a finished answer can be
rated: one still streaming may yet change. `/metrics` counts ratings given, by rating and
model: a first rating counts once under its rating, a changed rating once more under the
new one, and saving the same rating again (a new reason or comment) not at all. The admin's
figures are read from the table, which holds each answer's latest rating only.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from generation.models import Feedback, Message
from infrastructure import metrics

# The admin's satisfaction figure looks as far back as the usage chart beside it.
SATISFACTION_DAYS = 30


class CannotRate(ValueError):
    """The message is not an answer that can be rated (yet); the message says why."""


def feedback_set(*, message: Message, rating: str, reason: str = "", comment: str = "") -> Feedback:
    """Rate a finished answer, or change its rating, reason and comment."""
    if message.role != Message.Role.ASSISTANT:
        raise CannotRate("Only answers can be rated.")
    if message.streaming:
        raise CannotRate("This answer is still being written: rate it once it has finished.")
    fields = {"rating": rating, "reason": reason, "comment": comment}
    with transaction.atomic():
        feedback, created = Feedback.objects.select_for_update().get_or_create(message=message, defaults=fields)
        rating_changed = created or feedback.rating != rating
        if not created:
            for name, value in fields.items():
                setattr(feedback, name, value)
            feedback.save()
        if rating_changed:
            model = message.model
            transaction.on_commit(lambda: metrics.ANSWER_FEEDBACK.labels(rating, model).inc())
    message.feedback = feedback  # what the fragment shows next
    return feedback


@dataclass(frozen=True)
class Satisfaction:
    """One model's rated answers: how many were rated good and bad."""

    model: str
    good: int
    bad: int

    @property
    def rated(self) -> int:
        return self.good + self.bad

    @property
    def good_percent(self) -> int:
        return round(100 * self.good / self.rated) if self.rated else 0


def satisfaction_by_model(*, days: int = SATISFACTION_DAYS, now: dt.datetime | None = None) -> list[Satisfaction]:
    """Good and bad ratings per model, of answers last rated in the `days` days up to now."""
    since = (now or timezone.now()) - dt.timedelta(days=days)
    rows = (
        Feedback.objects.filter(updated_at__gte=since)
        .values("message__model")
        .annotate(
            good=Count("pk", filter=Q(rating=Feedback.Rating.GOOD)),
            bad=Count("pk", filter=Q(rating=Feedback.Rating.BAD)),
        )
        .order_by("message__model")
    )
    return [Satisfaction(model=row["message__model"], good=row["good"], bad=row["bad"]) for row in rows]
