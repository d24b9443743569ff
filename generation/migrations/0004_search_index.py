"""Full-text indexes for conversation search (generation/search.py).

SQLite: FTS5 tables over the titles and the message texts ("external content": they keep
only the index, the text stays in its table), kept in step by triggers, so that every way
a row is written (the views, the engine's periodic saves, the admin) is indexed alike.
PostgreSQL: GIN indexes on the very `to_tsvector` expressions that search.py queries.
Other databases get no index; search.py then refuses to search.

A later migration that rebuilds generation_conversation or generation_message on SQLite
(Django copies the table to change a column) drops these triggers with the old table:
such a migration must then run drop_search_index and create_search_index again
(tests/generation/test_search.py notices when it does not).
"""

from __future__ import annotations

from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVector
from django.db import migrations

# `unicode61 remove_diacritics 2`: case- and accent-insensitive words in any script.
_TOKENIZE = "tokenize='unicode61 remove_diacritics 2'"


def _fts_statements(table: str, column: str, rowid: str) -> list[str]:
    """An external-content FTS5 index over one column of `table`, its triggers and its backfill."""
    index = f"{table}_search"
    forget_old = f"INSERT INTO {index}({index}, rowid, {column}) VALUES ('delete', old.{rowid}, old.{column});"
    add_new = f"INSERT INTO {index}(rowid, {column}) VALUES (new.{rowid}, new.{column});"
    return [
        f"CREATE VIRTUAL TABLE {index} USING fts5({column}, content='{table}', content_rowid='{rowid}', {_TOKENIZE})",
        f"CREATE TRIGGER {index}_insert AFTER INSERT ON {table} BEGIN {add_new} END",
        f"CREATE TRIGGER {index}_delete AFTER DELETE ON {table} BEGIN {forget_old} END",
        f"CREATE TRIGGER {index}_update AFTER UPDATE OF {column} ON {table} BEGIN {forget_old} {add_new} END",
        f"INSERT INTO {index}({index}) VALUES ('rebuild')",
    ]


SQLITE_INDEXES = [("generation_message", "content", "id"), ("generation_conversation", "title", "rowid")]
SQLITE_SQL = [statement for index in SQLITE_INDEXES for statement in _fts_statements(*index)]

# The search config the queries use (search.SEARCH_CONFIG): no stemming, so that what is
# highlighted is what was typed, in any language.
POSTGRES_INDEXES = [
    ("Message", "content", "generation_message_search"),
    ("Conversation", "title", "generation_conversation_search"),
]


def _postgres_index(field: str, name: str) -> GinIndex:
    return GinIndex(SearchVector(field, config="simple"), name=name)


def create_search_index(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "sqlite":
        for statement in SQLITE_SQL:
            schema_editor.execute(statement)
    elif vendor == "postgresql":
        for model_name, field, name in POSTGRES_INDEXES:
            schema_editor.add_index(apps.get_model("generation", model_name), _postgres_index(field, name))


def drop_search_index(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "sqlite":
        for table, _column, _rowid in SQLITE_INDEXES:
            for event in ("insert", "delete", "update"):
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_search_{event}")
            schema_editor.execute(f"DROP TABLE IF EXISTS {table}_search")
    elif vendor == "postgresql":
        for model_name, field, name in POSTGRES_INDEXES:
            schema_editor.remove_index(apps.get_model("generation", model_name), _postgres_index(field, name))


class Migration(migrations.Migration):
    dependencies = [("generation", "0003_upstreamendpoint")]

    operations = [migrations.RunPython(create_search_index, drop_search_index, elidable=False)]
