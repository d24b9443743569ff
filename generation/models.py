from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.urls import reverse

from accounts.models import GenerationStatus


class Conversation(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations")
    title = models.CharField(max_length=200, blank=True)
    model = models.CharField(max_length=200)
    system_prompt = models.TextField(blank=True)
    temperature = models.FloatField(default=0.2)
    max_tokens = models.PositiveIntegerField(default=512)
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
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.role}: {self.content[:40]}"

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
