"""Passage vectors (documents.vectors): a float32 blob on every database; on PostgreSQL with
the pgvector extension available, also an `embedding vector` column that pgvector searches.

Without pgvector (its extension not available, or not ours to create) the column is left
out, and the search is an exact one over the conversation's blobs.
"""

import django.db.models.deletion
from django.db import migrations, models


def _pgvector_column(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")
        if cursor.fetchone() is None:
            return
        cursor.execute("SAVEPOINT pgvector")
        try:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS vector")
        except Exception:  # available but not ours to create: the exact search does without
            cursor.execute("ROLLBACK TO SAVEPOINT pgvector")
            return
        cursor.execute("ALTER TABLE documents_passagevector ADD COLUMN embedding vector")


def _pgvector_column_drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE documents_passagevector DROP COLUMN IF EXISTS embedding")


class Migration(migrations.Migration):
    dependencies = [
        ("documents", "0002_passage_search_index"),
    ]

    operations = [
        migrations.CreateModel(
            name="PassageVector",
            fields=[
                (
                    "passage",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="vector",
                        serialize=False,
                        to="documents.passage",
                    ),
                ),
                (
                    "document",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="+", to="documents.document"
                    ),
                ),
                ("model", models.CharField(max_length=100)),
                ("vector", models.BinaryField()),
            ],
        ),
        migrations.RunPython(_pgvector_column, _pgvector_column_drop),
    ]
