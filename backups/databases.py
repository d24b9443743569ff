"""Copies of the whole database, taken while the site runs, and put back.

One `DatabaseCopy` per vendor, chosen once (`database_copy`):

- SQLite: the online backup API (`sqlite3.Connection.backup`), which copies every page
  under one read transaction: a consistent copy while the site writes (WAL mode lets it
  go on writing), the full-text index of documents (an FTS5 table) included. A plain
  file copy could miss the pages still in the `-wal` file or catch a half-written one.
- PostgreSQL: `pg_dump --format=custom`, in a snapshot that this process exports from a
  REPEATABLE READ transaction, so that the manifest's row counts and migrations are read
  from exactly the data that is dumped. Restored by `pg_restore` piped into `psql
  --single-transaction`, after dropping every table of the database in that same
  transaction: a restore that fails half-way changes nothing, and tables made by later
  migrations than the archive's are gone before `migrate` makes them again.

Each copy also says what it holds (`Contents`: rows per table, applied migrations), read
from the copy's own snapshot, for the manifest and for the check after a restore.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
from collections.abc import Iterable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from django.apps import apps
from django.db import connection, connections, transaction


class BackupError(Exception):
    """A backup or restore that cannot go on; the message says why and what to do."""


@dataclass(frozen=True)
class Contents:
    """What a database holds, for a quick comparison: rows per model and applied migrations."""

    counts: dict[str, int]
    migrations: list[tuple[str, str]]


class DatabaseCopy(Protocol):
    vendor: str
    file_name: str

    def dump(self, target: Path) -> Contents:
        """Write a consistent copy of the whole database to `target`."""
        ...

    def load(self, source: Path) -> None:
        """Replace the whole database with the copy at `source`."""
        ...

    def contents(self) -> Contents:
        """What the configured database holds now."""
        ...


def database_copy() -> DatabaseCopy:
    """The copier of the configured database."""
    if connection.vendor == "sqlite":
        return SqliteCopy(Path(connection.settings_dict["NAME"]))
    if connection.vendor == "postgresql":
        return PostgresCopy(connection.settings_dict)
    raise BackupError(f"Backups support SQLite and PostgreSQL, not {connection.vendor}.")


def _model_tables() -> dict[str, str]:
    """Each concrete model's label and table, but the record of backups themselves: it is
    written after the copy is taken, and a restore keeps this site's (services.backup_restore)."""
    return {
        model._meta.label_lower: model._meta.db_table
        for model in apps.get_models()
        if model._meta.managed and not model._meta.proxy and model._meta.app_label != "backups"
    }


def _read_contents(cursor: Any, existing_tables: Iterable[str]) -> Contents:
    existing = set(existing_tables)
    counts = {}
    for label, table in sorted(_model_tables().items()):
        if table in existing:  # a model newer than the database's migrations has none yet
            cursor.execute(f'SELECT COUNT(*) FROM "{table}"')
            counts[label] = cursor.fetchone()[0]
    migrations: list[tuple[str, str]] = []
    if "django_migrations" in existing:
        cursor.execute("SELECT app, name FROM django_migrations ORDER BY app, name")
        migrations = [(app, name) for app, name in cursor.fetchall()]
    return Contents(counts, migrations)


class SqliteCopy:
    vendor = "sqlite"
    file_name = "database.sqlite3"

    def __init__(self, path: Path) -> None:
        self.path = path

    def dump(self, target: Path) -> Contents:
        if not self.path.exists():
            raise BackupError(f"There is no database at {self.path}: nothing to back up.")
        source_uri = f"file:{self.path}?mode=ro"
        with (
            closing(sqlite3.connect(source_uri, uri=True, timeout=20)) as source,
            closing(sqlite3.connect(target)) as copy,
        ):
            source.backup(copy)
            # One self-contained file: the copy would otherwise keep the source's WAL mode.
            copy.execute("PRAGMA journal_mode=DELETE")
            return _sqlite_contents(copy)

    def load(self, source: Path) -> None:
        # Django's connections are closed first: the backup API needs the write lock.
        connections.close_all()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(sqlite3.connect(source)) as archived:
            if archived.execute("PRAGMA integrity_check").fetchone()[0] != "ok":
                raise BackupError("The archive's database fails SQLite's integrity check.")
            with closing(sqlite3.connect(self.path, timeout=20)) as database:
                archived.backup(database)

    def contents(self) -> Contents:
        with closing(sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)) as database:
            return _sqlite_contents(database)


def _sqlite_contents(database: sqlite3.Connection) -> Contents:
    tables = [row[0] for row in database.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    with closing(database.cursor()) as cursor:
        return _read_contents(cursor, tables)


class PostgresCopy:
    vendor = "postgresql"
    file_name = "database.pgdump"

    def __init__(self, settings_dict: dict[str, Any]) -> None:
        self.settings_dict = settings_dict

    def dump(self, target: Path) -> Contents:
        pg_dump = _client_program("pg_dump")
        connection.ensure_connection()
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            cursor.execute("SELECT pg_export_snapshot()")
            snapshot = cursor.fetchone()[0]
            contents = _read_contents(cursor, connection.introspection.table_names(cursor))
            # The snapshot lives as long as this transaction: pg_dump runs inside it.
            command = [pg_dump, "--format=custom", "--no-password", f"--snapshot={snapshot}"]
            _run([*command, f"--file={target}", self._database_name()], env=self._environment())
        return contents

    def load(self, source: Path) -> None:
        pg_restore, psql = _client_program("pg_restore"), _client_program("psql")
        with connection.cursor() as cursor:
            tables = connection.introspection.table_names(cursor)
        connections.close_all()
        drops = "".join(f'DROP TABLE IF EXISTS "{table}" CASCADE;' for table in tables)
        script = subprocess.Popen(
            [pg_restore, "--clean", "--if-exists", "--no-owner", "--no-privileges", "--file=-", str(source)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert script.stdout is not None
        try:
            psql_command = [psql, "--no-psqlrc", "--quiet", "--no-password", "--set=ON_ERROR_STOP=1"]
            psql_command += ["--single-transaction", f"--command={drops or 'SELECT 1;'}", "--file=-"]
            _run([*psql_command, self._database_name()], env=self._environment(), stdin=script.stdout)
        finally:
            script.stdout.close()
            _, errors = script.communicate()
        if script.returncode:
            raise BackupError(f"pg_restore could not read the archive's dump: {errors.decode(errors='replace')}")

    def contents(self) -> Contents:
        with connection.cursor() as cursor:
            return _read_contents(cursor, connection.introspection.table_names(cursor))

    def _database_name(self) -> str:
        return f"--dbname={self.settings_dict['NAME']}"

    def _environment(self) -> dict[str, str]:
        """The client programs' connection settings: the password in PGPASSWORD, never on a
        command line (which `ps` shows to every user of the machine)."""
        settings_dict = self.settings_dict
        options = settings_dict.get("OPTIONS") or {}
        values = {
            "PGHOST": settings_dict.get("HOST"),
            "PGPORT": settings_dict.get("PORT"),
            "PGUSER": settings_dict.get("USER"),
            "PGPASSWORD": settings_dict.get("PASSWORD"),
            "PGSSLMODE": options.get("sslmode"),
        }
        return {**os.environ, **{name: str(value) for name, value in values.items() if value}}


def _client_program(name: str) -> str:
    found = shutil.which(name)
    if not found:
        raise BackupError(
            f"{name} is not installed: PostgreSQL backups need the client programs of the server's "
            "major version or newer (Debian/Ubuntu: apt-get install postgresql-client)."
        )
    return found


def _run(command: list[str], *, env: dict[str, str], stdin: Any = None) -> None:
    finished = subprocess.run(command, env=env, stdin=stdin, capture_output=True, check=False)
    if finished.returncode:
        program = Path(command[0]).name
        message = finished.stderr.decode(errors="replace").strip()
        raise BackupError(f"{program} failed (exit status {finished.returncode}): {message}")
