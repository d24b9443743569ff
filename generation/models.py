from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.urls import reverse

from accounts.models import GenerationStatus
from inference.upstream import Endpoint


class Conversation(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations")
    title = models.CharField(max_length=200, blank=True)
    model = models.CharField(max_length=200)
    system_prompt = models.TextField(blank=True)
    temperature = models.FloatField(default=0.2)
    max_tokens = models.PositiveIntegerField(default=512)
    # The last message of the branch shown and continued (see selectors); empty: the newest message.
    current_leaf = models.ForeignKey(
        "Message", on_delete=models.SET_NULL, null=True, blank=True, related_name="+", editable=False
    )
    # Pinned conversations head the sidebar (most recently pinned first); archived ones leave
    # it, and come back from the Archived view. Both are times rather than flags: the sidebar
    # orders pins by them, and export keeps when it happened.
    pinned_at = models.DateTimeField(null=True, blank=True)
    archived_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [models.Index(fields=["user", "-updated_at"])]

    def __str__(self) -> str:
        return self.title or "New chat"

    def get_absolute_url(self) -> str:
        return reverse("generation:conversation", args=[self.id])


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"

    Status = GenerationStatus

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    # The message this one follows: a prompt follows an answer (none: it opens the conversation),
    # an answer its prompt. Messages with the same parent are versions of one another.
    parent = models.ForeignKey("self", on_delete=models.CASCADE, null=True, blank=True, related_name="children")
    role = models.CharField(max_length=20, choices=Role.choices)
    content = models.TextField(blank=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.COMPLETE)
    stream_id = models.CharField(max_length=64, unique=True, null=True, blank=True)
    model = models.CharField(max_length=200, blank=True)
    # The engine that generates a streaming answer; see Engine.producer.
    producer = models.CharField(max_length=200, blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    ttft_ms = models.PositiveIntegerField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    finish_reason = models.CharField(max_length=20, blank=True)
    error = models.TextField(blank=True)
    # An answer from documents: the passages its prompt carried, numbered as it cites them
    # (documents.services.retrieval_for); kept here so that they outlive their documents.
    sources = models.JSONField(default=list, blank=True)
    # Streamed from the response cache rather than generated (generation/backends/response_cache.py).
    from_cache = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.role}: {self.content[:40]}"

    def save(self, *args: Any, root: bool = False, **kwargs: Any) -> None:
        """Save; a new message given no parent continues the branch shown (as messages
        written by a script or an older caller always did), unless it is a `root`: a
        first prompt, or a version of one."""
        appended = self._state.adding and self.parent_id is None and not root
        leaf = self.conversation.current_leaf_id if appended else None
        if appended:
            last = self.conversation.messages.order_by("-created_at", "-id").first()
            self.parent_id = leaf or (last.pk if last else None)
        super().save(*args, **kwargs)
        if leaf is not None:  # the branch shown grows by this message
            Conversation.objects.filter(pk=self.conversation_id, current_leaf_id=leaf).update(current_leaf=self)

    @property
    def streaming(self) -> bool:
        return self.status == self.Status.STREAMING

    @property
    def tokens_per_s(self) -> float | None:
        if not self.completion_tokens or self.completion_tokens < 2 or not self.duration_ms:
            return None
        decode_ms = self.duration_ms - (self.ttft_ms or 0)
        return round((self.completion_tokens - 1) * 1000 / decode_ms, 1) if decode_ms > 0 else None

    def get_stream_url(self) -> str:
        return reverse("generation:answer_stream", args=[self.stream_id])


class Feedback(models.Model):
    """What the owner of a conversation thought of one finished answer: 👍 or 👎, why, and
    optionally a comment. One per answer; rating again changes it."""

    class Rating(models.TextChoices):
        GOOD = "good", "Good answer"
        BAD = "bad", "Bad answer"

    class Reason(models.TextChoices):
        NONE = "", "No reason given"
        INACCURATE = "inaccurate", "Not accurate"
        UNHELPFUL = "unhelpful", "Not helpful"
        INCOMPLETE = "incomplete", "Incomplete"
        UNSAFE = "unsafe", "Harmful or unsafe"
        HELPFUL = "helpful", "Helpful"
        CLEAR = "clear", "Clear and well written"
        OTHER = "other", "Something else"

    message = models.OneToOneField(Message, on_delete=models.CASCADE, related_name="feedback")
    rating = models.CharField(max_length=8, choices=Rating.choices)
    reason = models.CharField(max_length=20, choices=Reason.choices, blank=True)
    comment = models.TextField(max_length=2000, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        verbose_name = "rated answer"
        indexes = [models.Index(fields=["rating", "-updated_at"])]

    def __str__(self) -> str:
        return f"{self.get_rating_display()} on message {self.message_id}"


class SharedLink(models.Model):
    """A read-only snapshot of one conversation's branch, at /s/<token>/.

    The snapshot is a copy (messages, their sources' names and excerpts, not the files):
    later edits leave it as it was, and "Update link" copies the branch again under the same
    token. Deleting the conversation deletes its link.
    """

    token = models.CharField(max_length=64, unique=True, editable=False)
    conversation = models.OneToOneField(Conversation, on_delete=models.CASCADE, related_name="shared_link")
    title = models.CharField(max_length=200, blank=True)
    # [{"role", "content", "model", "status", "sources": [{"number", "document", "excerpt"}]}]
    messages = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]

    def __str__(self) -> str:
        return self.title or "New chat"

    def get_absolute_url(self) -> str:
        return reverse("shared", args=[self.token])


class UpstreamEndpoint(models.Model):
    """A model server (vLLM, TGI, Ollama, llama.cpp, any OpenAI-compatible endpoint) that
    serves a public model name; several endpoints of one name share its requests."""

    model = models.CharField("public model name", max_length=200, help_text="The name clients ask for.")
    base_url = models.URLField("base URL", max_length=500, help_text="The API root, ending in /v1.")
    upstream_model = models.CharField(max_length=200, help_text="The name the server knows the model by.")
    api_key = models.CharField("API key", max_length=500, blank=True)
    max_concurrent = models.PositiveIntegerField(default=16, validators=[MinValueValidator(1)])
    weight = models.FloatField(default=1.0, validators=[MinValueValidator(0.01)])
    connect_timeout_s = models.FloatField(default=5.0, validators=[MinValueValidator(0.1)])
    first_token_timeout_s = models.FloatField(default=60.0, validators=[MinValueValidator(0.1)])
    read_timeout_s = models.FloatField(
        default=60.0, validators=[MinValueValidator(0.1)], help_text="The longest silence between two chunks."
    )
    context_length = models.PositiveIntegerField(
        null=True, blank=True, help_text="Tokens the model holds; empty: the server refuses what doesn't fit."
    )
    tokenizer = models.CharField(
        max_length=500,
        blank=True,
        help_text="A tokenizer like the server's (a model name, local directory or hub id), to count "
        "tokens here; empty: estimated, unless the server reports its usage (vLLM and TGI do).",
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model", "pk"]

    def __str__(self) -> str:
        return f"{self.model} @ {self.base_url}"

    def as_endpoint(self) -> Endpoint:
        return Endpoint(
            name=f"admin-{self.pk}",
            model=self.model,
            base_url=self.base_url,
            upstream_model=self.upstream_model,
            api_key=self.api_key,
            max_concurrent=self.max_concurrent,
            weight=self.weight,
            connect_timeout_s=self.connect_timeout_s,
            first_token_timeout_s=self.first_token_timeout_s,
            read_timeout_s=self.read_timeout_s,
            context_length=self.context_length,
            tokenizer=self.tokenizer or None,
        )


class ModelFallback(models.Model):
    """A model to serve a request instead of `model` when `model` cannot take it before its
    first token: no endpoint up, its queue full, or a prompt beyond its context. A model's
    fallbacks are tried in `position` order, each only for callers who may use it."""

    model = models.CharField(max_length=200, help_text="The model clients ask for.")
    fallback = models.CharField(max_length=200, help_text="The model that serves its requests instead.")
    position = models.PositiveSmallIntegerField(default=0, help_text="Lower first, among this model's fallbacks.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model", "position", "pk"]
        constraints = [
            models.UniqueConstraint(fields=["model", "fallback"], name="model_fallback_once"),
            models.CheckConstraint(
                condition=~models.Q(fallback=models.F("model")),
                name="model_fallback_not_itself",
                violation_error_message="A model cannot be its own fallback.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.model} → {self.fallback}"


class ModelResidency(models.Model):
    """An operator's word on one of the models this deployment runs itself (in its web
    processes or Celery workers): keep it in memory, or unload it now. Every process that
    runs the model reads it every few seconds (generation/residency.py), so a click reaches
    them all with no message bus, and "keep warm" outlives restarts."""

    model = models.CharField(max_length=200, unique=True)
    keep_warm = models.BooleanField(
        default=False, help_text="Never unloaded while idle, nor to make room for another model; loaded now if out."
    )
    # Each "unload now" adds one: a process unloads once for each rise it sees.
    unload_requests = models.PositiveIntegerField(default=0, editable=False)
    unload_requested_at = models.DateTimeField(null=True, blank=True, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model"]
        verbose_name = "model residency"
        verbose_name_plural = "model residency"

    def __str__(self) -> str:
        return self.model
