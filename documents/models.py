from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.search import SearchVectorField
from django.db import models
from django.urls import reverse


class Document(models.Model):
    """A file attached to a conversation; its text lives on as passages."""

    class Kind(models.TextChoices):
        TEXT = "text"
        MARKDOWN = "markdown"
        PDF = "pdf"

    # A string reference: documents sit below the chat app and never import it.
    conversation = models.ForeignKey("generation.Conversation", on_delete=models.CASCADE, related_name="documents")
    # The owner, kept on the row so that every query can say "this user's" on its own.
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="documents")
    name = models.CharField(max_length=255)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    size_bytes = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return self.name


class Passage(models.Model):
    """A few hundred tokens of a document, the unit that retrieval finds and cites.

    Indexed for full-text search by the database (documents.search): on SQLite by an FTS5
    table kept in step by triggers, on PostgreSQL by `search`, a tsvector with a GIN index
    (the column stays empty on SQLite).
    """

    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="passages")
    position = models.PositiveIntegerField()
    heading = models.CharField(max_length=500, blank=True)
    text = models.TextField()
    search = SearchVectorField(null=True, editable=False)

    class Meta:
        ordering = ["document", "position"]

    def __str__(self) -> str:
        return f"{self.document} #{self.position}"

    def get_absolute_url(self) -> str:
        return reverse("documents:passage", args=[self.pk])


class PassageVector(models.Model):
    """A passage's embedding (documents.vectors): float32, little-endian, a unit vector of
    `model`'s. Written when its document is indexed, or by `manage.py embed_passages`; a
    passage without one is found by its words alone."""

    passage = models.OneToOneField(Passage, on_delete=models.CASCADE, primary_key=True, related_name="vector")
    # The passage's, kept here too: a question reads (and counts) its conversation's vectors
    # by their documents, through this index, without joining the passages.
    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="+")
    model = models.CharField(max_length=100)
    vector = models.BinaryField()

    def __str__(self) -> str:
        return f"{self.passage_id} ({self.model})"
