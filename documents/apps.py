from django.apps import AppConfig
from django.db.backends.signals import connection_created


class DocumentsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "documents"

    def ready(self) -> None:
        from documents.vectors import sqlite_vec_load  # models are ready only now

        # Configuring the database connection, as Django's own backends do: sqlite-vec's
        # functions, on every new SQLite connection where Python allows extensions.
        connection_created.connect(sqlite_vec_load, dispatch_uid="documents.sqlite_vec_load")
