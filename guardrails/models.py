from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from guardrails import matching, rule_cache


class Stage(models.TextChoices):
    PROMPT = "prompt"
    ANSWER = "answer"
    BOTH = "both"


class Action(models.TextChoices):
    BLOCK = matching.BLOCK
    MASK = matching.MASK
    FLAG = matching.FLAG


class Channel(models.TextChoices):
    # UsageRecord.Channel's names: the browser chat, its WebSocket, the API.
    UI = "ui"
    WS = "ws"
    API = "api"


class PolicyRule(models.Model):
    """One rule of the content policy, applied in `position` order to prompts, answers or both."""

    class Matcher(models.TextChoices):
        WORDS = matching.WORDS, "word list"
        REGEX = matching.REGEX, "regular expression"
        PII = matching.PII, "personal data (e-mail, phone, IBAN, card)"
        MODERATION = matching.MODERATION, "moderation service (OpenAI /v1/moderations)"

    name = models.CharField(max_length=100)
    position = models.PositiveIntegerField(default=0, help_text="Rules apply in this order, lowest first.")
    enabled = models.BooleanField(default=True)
    matcher = models.CharField(max_length=16, choices=Matcher.choices)
    pattern = models.TextField(
        blank=True,
        help_text="Word list: one word or phrase per line. Regular expression: Python's syntax. "
        "Personal data: the kinds, comma-separated (email, phone, iban, card; blank: all). "
        "Moderation service: its URL (…/v1/moderations).",
    )
    stage = models.CharField(max_length=8, choices=Stage.choices, default=Stage.BOTH)
    action = models.CharField(max_length=8, choices=Action.choices, default=Action.MASK)
    message = models.CharField(
        max_length=500,
        blank=True,
        help_text="Block: what the user is told. Mask: what a match becomes (blank: [redacted], or the "
        "kind of personal data, e.g. [email]).",
    )
    # Scope: blank is everyone, every channel, every model.
    plans = models.ManyToManyField("accounts.Plan", blank=True, related_name="policy_rules")
    channels = models.JSONField(default=list, blank=True, help_text="ui, ws, api: one per line. Blank: all.")
    model_names = models.JSONField(
        "models", default=list, blank=True, help_text="Model names, one per line. Blank: all."
    )
    # A moderation service's.
    moderation_token = models.CharField(max_length=500, blank=True, help_text="Sent as a Bearer token, if set.")
    moderation_timeout_s = models.FloatField(
        "moderation timeout (s)", default=2.0, validators=[MinValueValidator(0.05), MaxValueValidator(60)]
    )
    moderation_fail_open = models.BooleanField(
        "allow when the service fails",
        default=True,
        help_text="When the service is slow or down: allow the text, prompt or answer (checked), or apply the "
        "action (unchecked).",
    )

    class Meta:
        ordering = ["position", "pk"]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        super().save(*args, **kwargs)
        rule_cache.policy_rules_changed()  # every process applies it at its next admission

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        deleted = super().delete(*args, **kwargs)
        rule_cache.policy_rules_changed()
        return deleted

    def clean(self) -> None:
        if self.matcher == matching.MODERATION:
            if not self.pattern.startswith(("http://", "https://")):
                raise ValidationError({"pattern": "A moderation service's URL: http://… or https://…"})
            if self.action == Action.MASK:
                raise ValidationError(
                    {"action": "A moderation service judges a whole text and finds no words to mask: block or flag."}
                )
            return
        try:
            matching.validate_rule(self.spec())
        except ValueError as error:
            raise ValidationError({"pattern": str(error)}) from None
        unknown = set(self.channels or []) - set(Channel.values)
        if unknown:
            raise ValidationError({"channels": f"Unknown channels: {', '.join(sorted(unknown))}."})

    def spec(self) -> matching.RuleSpec:
        return matching.RuleSpec(
            self.pk or 0,
            self.name,
            self.matcher,
            self.pattern,
            self.action,
            self.message,
            timeout_s=self.moderation_timeout_s,
            fail_open=self.moderation_fail_open,
            token=self.moderation_token,
        )


class PolicyEvent(models.Model):
    """A rule's match worth keeping: every block and flag (the review queue holds the flags)."""

    class Review(models.TextChoices):
        OPEN = "open"
        KEPT = "kept"
        REDACTED = "redacted"
        DELETED = "deleted"

    rule = models.ForeignKey(PolicyRule, on_delete=models.SET_NULL, null=True, blank=True, related_name="events")
    rule_name = models.CharField(max_length=100)  # kept when the rule goes
    action = models.CharField(max_length=8, choices=Action.choices)
    stage = models.CharField(max_length=8, choices=Stage.choices)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    channel = models.CharField(max_length=8, blank=True)
    model = models.CharField(max_length=200, blank=True)
    excerpt = models.TextField(blank=True)  # the matched text (a moderation service's: the start of the text)
    stream_id = models.CharField(max_length=64, blank=True)
    # The chat message it was found in (generation.Message), where there is one.
    message_id = models.BigIntegerField(null=True, blank=True)
    review = models.CharField(max_length=8, choices=Review.choices, default=Review.OPEN)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.rule_name}: {self.action} ({self.stage})"
