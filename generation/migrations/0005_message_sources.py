"""Message.sources: the passages an answer from documents cites (documents/).

On SQLite adding a column rebuilds generation_message, which drops the search index's
triggers with the old table (0004_search_index says so): the index is dropped before and
made again after, there only.
"""

import importlib

from django.db import migrations, models

search_index = importlib.import_module("generation.migrations.0004_search_index")


def _on_sqlite(step):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "sqlite":
            step(apps, schema_editor)

    return run


class Migration(migrations.Migration):

    dependencies = [
        ('generation', '0004_search_index'),
    ]

    operations = [
        migrations.RunPython(
            _on_sqlite(search_index.drop_search_index), _on_sqlite(search_index.create_search_index), elidable=False
        ),
        migrations.AddField(
            model_name='message',
            name='sources',
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.RunPython(
            _on_sqlite(search_index.create_search_index), _on_sqlite(search_index.drop_search_index), elidable=False
        ),
    ]
