"""What the API keeps of its own: the stored answers of the Responses API (POST /v1/responses)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from api.response_events import ResponseHead, ResponseOutcome


class StoredResponse(models.Model):
    """A response created with `store` (the default): its owner may read it back, and continue
    it with `previous_response_id`.

    `context` is the conversation of the responses it continues, as chat messages; `input` its
    own input. The output is saved by whoever reads the generation's end first (the request, a
    resumed stream, or a later read of the response: api.services.stored_response_settle),
    since the generation's producer saves the ledger, not an API answer's text.
    """

    class Status(models.TextChoices):
        IN_PROGRESS = "in_progress"
        COMPLETED = "completed"
        INCOMPLETE = "incomplete"
        CANCELLED = "cancelled"
        FAILED = "failed"

    id = models.CharField(primary_key=True, max_length=64, editable=False)  # RESPONSE_PREFIX + stream_id
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="stored_responses")
    stream_id = models.CharField(max_length=64, unique=True)
    model = models.CharField(max_length=200)
    instructions = models.TextField(blank=True)
    context = models.JSONField(default=list)
    input = models.JSONField(default=list)
    # The request's fields echoed in the response: temperature, top_p, max_output_tokens, metadata, background.
    params = models.JSONField(default=dict)
    previous_response_id = models.CharField(max_length=64, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.IN_PROGRESS)
    output_text = models.TextField(blank=True)
    usage = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    incomplete_reason = models.CharField(max_length=32, blank=True)
    created_at = models.DateTimeField(default=timezone.now)  # the response's created_at, to the second
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["user", "-created_at"])]

    def __str__(self) -> str:
        return self.id

    def conversation(self) -> list[dict[str, Any]]:
        """The messages a response continuing this one starts from: its context, its input, its answer."""
        return [*self.context, *self.input, {"role": "assistant", "content": self.output_text}]

    def head(self) -> ResponseHead:
        return ResponseHead(
            stream_id=self.stream_id,
            model=self.model,
            created_at=int(self.created_at.timestamp()),
            instructions=self.instructions or None,
            previous_response_id=self.previous_response_id or None,
            params=self.params,
        )

    def outcome(self) -> ResponseOutcome:
        return ResponseOutcome(
            status=self.status,
            text=self.output_text,
            usage=self.usage,
            error=self.error,
            incomplete_reason=self.incomplete_reason or None,
            completed_at=int(self.completed_at.timestamp()) if self.completed_at else None,
        )
