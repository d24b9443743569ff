"""Full-text indexes for conversation search (generation/search.py).

SQLite: FTS5 tables over the titles and the message texts, kept in step by triggers, so
that every way a row is written (the views, the engine's periodic saves, the admin) is
indexed alike.
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

# Messages: an "external content" index (it keeps no copy of the text) keyed by the
# message's integer primary key. Triggers fire only when the text really changes (the
# engine saves a streaming answer every 2 s; Django's save() writes every column).
_MESSAGES = [
    "CREATE VIRTUAL TABLE generation_message_search USING fts5("
    f"content, content='generation_message', content_rowid='id', {_TOKENIZE})",
    "CREATE TRIGGER generation_message_search_insert AFTER INSERT ON generation_message BEGIN "
    "INSERT INTO generation_message_search(rowid, content) VALUES (new.id, new.content); END",
    "CREATE TRIGGER generation_message_search_delete AFTER DELETE ON generation_message BEGIN "
    "INSERT INTO generation_message_search(generation_message_search, rowid, content) "
    "VALUES ('delete', old.id, old.content); END",
    "CREATE TRIGGER generation_message_search_update AFTER UPDATE OF content ON generation_message "
    "WHEN old.content IS NOT new.content BEGIN "
    "INSERT INTO generation_message_search(generation_message_search, rowid, content) "
    "VALUES ('delete', old.id, old.content); "
    "INSERT INTO generation_message_search(rowid, content) VALUES (new.id, new.content); END",
    "INSERT INTO generation_message_search(generation_message_search) VALUES ('rebuild')",
]
# Conversations have a UUID key and no integer one (their SQLite rowid may change on VACUUM),
# so the titles index keeps its own copy of each (short) title with the conversation's id.
_CONVERSATIONS = [
    f"CREATE VIRTUAL TABLE generation_conversation_search USING fts5(title, conversation_id UNINDEXED, {_TOKENIZE})",
    "CREATE TRIGGER generation_conversation_search_insert AFTER INSERT ON generation_conversation BEGIN "
    "INSERT INTO generation_conversation_search(title, conversation_id) VALUES (new.title, new.id); END",
    "CREATE TRIGGER generation_conversation_search_delete AFTER DELETE ON generation_conversation BEGIN "
    "DELETE FROM generation_conversation_search WHERE conversation_id = old.id; END",
    "CREATE TRIGGER generation_conversation_search_update AFTER UPDATE OF title ON generation_conversation "
    "WHEN old.title IS NOT new.title BEGIN "
    "UPDATE generation_conversation_search SET title = new.title WHERE conversation_id = old.id; END",
    "INSERT INTO generation_conversation_search(title, conversation_id) SELECT title, id FROM generation_conversation",
]
SQLITE_SQL = _MESSAGES + _CONVERSATIONS
SQLITE_TABLES = ["generation_message", "generation_conversation"]

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
        for table in SQLITE_TABLES:
            for event in ("insert", "delete", "update"):
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_search_{event}")
            schema_editor.execute(f"DROP TABLE IF EXISTS {table}_search")
    elif vendor == "postgresql":
        for model_name, field, name in POSTGRES_INDEXES:
            schema_editor.remove_index(apps.get_model("generation", model_name), _postgres_index(field, name))


class Migration(migrations.Migration):
    dependencies = [("generation", "0003_upstreamendpoint")]

    operations = [migrations.RunPython(create_search_index, drop_search_index, elidable=False)]
