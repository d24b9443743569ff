"""Uploading a file to a conversation, as the page's form does."""

from __future__ import annotations

from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from tests.support.chat import HTMX


def upload(client, conversation, name: str, data: bytes, **extra):
    url = reverse("documents:upload", args=[conversation.id])
    return client.post(url, {"file": SimpleUploadedFile(name, data)}, **{**HTMX, **extra})
