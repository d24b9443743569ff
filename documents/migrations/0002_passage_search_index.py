"""The full-text index of passages, in the database in use (documents.search).

SQLite: an FTS5 table over documents_passage (external content: it stores only the
index), with the Porter stemmer, kept in step by triggers, so that every way a passage
goes (a removed document, a deleted conversation or user) takes its index entries too.
PostgreSQL: a GIN index on the passages' tsvector.
"""

from django.db import migrations

SQLITE_CREATE = [
    """CREATE VIRTUAL TABLE documents_passage_fts USING fts5(
        heading, text, content='documents_passage', content_rowid='id',
        tokenize='porter unicode61 remove_diacritics 2')""",
    """CREATE TRIGGER documents_passage_fts_insert AFTER INSERT ON documents_passage BEGIN
        INSERT INTO documents_passage_fts(rowid, heading, text) VALUES (new.id, new.heading, new.text);
    END""",
    """CREATE TRIGGER documents_passage_fts_delete AFTER DELETE ON documents_passage BEGIN
        INSERT INTO documents_passage_fts(documents_passage_fts, rowid, heading, text)
        VALUES ('delete', old.id, old.heading, old.text);
    END""",
    """CREATE TRIGGER documents_passage_fts_update AFTER UPDATE OF heading, text ON documents_passage BEGIN
        INSERT INTO documents_passage_fts(documents_passage_fts, rowid, heading, text)
        VALUES ('delete', old.id, old.heading, old.text);
        INSERT INTO documents_passage_fts(rowid, heading, text) VALUES (new.id, new.heading, new.text);
    END""",
]
SQLITE_DROP = [
    "DROP TRIGGER IF EXISTS documents_passage_fts_update",
    "DROP TRIGGER IF EXISTS documents_passage_fts_delete",
    "DROP TRIGGER IF EXISTS documents_passage_fts_insert",
    "DROP TABLE IF EXISTS documents_passage_fts",
]
POSTGRES_CREATE = ["CREATE INDEX documents_passage_search_gin ON documents_passage USING gin (search)"]
POSTGRES_DROP = ["DROP INDEX IF EXISTS documents_passage_search_gin"]


def _run(statements_by_vendor):
    def run(apps, schema_editor):
        for statement in statements_by_vendor.get(schema_editor.connection.vendor, []):
            schema_editor.execute(statement)

    return run


class Migration(migrations.Migration):
    dependencies = [("documents", "0001_initial")]

    operations = [
        migrations.RunPython(
            _run({"sqlite": SQLITE_CREATE, "postgresql": POSTGRES_CREATE}),
            _run({"sqlite": SQLITE_DROP, "postgresql": POSTGRES_DROP}),
        )
    ]
