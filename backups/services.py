"""Backups of the site into one archive file, and restores from one (docs/operations.md: Backups).

An archive is a gzipped tar holding two members:

- `manifest.json`: the format version, when it was made, the database vendor, Django's
  version, the migrations applied (all, and the latest per app), rows per model, the
  database file's SHA-256, a few non-secret settings, and a fingerprint of the secret key;
- the database: `database.sqlite3` (SQLite) or `database.pgdump` (PostgreSQL's custom format).

Uploaded documents are rows like any other (documents.models keeps their text as passages;
no file is kept on disk) and so travel in the database. What is not in an archive, and why:

- The secret key. Whoever holds it can sign session cookies for any user, admins included,
  and archives are copied to more places than the server. Nothing stored depends on it
  (API keys are plain SHA-256 hashes, passwords salted hashes): a site restored under
  another key keeps every account and key, but everyone logs in again and password-reset
  links already sent stop working. The manifest keeps a fingerprint (a hash that cannot be
  turned back into the key), so `restore` says whether the key matches the archive's.
- The rest of the configuration: it is the environment (.env.example), kept by whoever
  deploys the site; the manifest lists a few settings that shape the data, for reference.
- Redis (live streams, counters, queues) and the converted model weights: rebuilt.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import os
import tarfile
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import django
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.utils import timezone

from backups.databases import BackupError, Contents, DatabaseCopy, database_copy
from backups.models import Backup

FORMAT = 1
MANIFEST = "manifest.json"
# Non-secret settings that shape what is stored; recorded for whoever rebuilds the site.
RECORDED_SETTINGS = ("TIME_ZONE", "CHAT_MODEL", "CHAT_SIGNUP", "CHAT_GUEST", "CHAT_SHARING", "GENERATION_BACKEND")


@dataclass(frozen=True)
class RestoreReport:
    manifest: dict[str, Any]
    # Model label -> (rows in the archive, rows now), for every model the archive counted.
    counts: dict[str, tuple[int, int | None]]
    # Migrations that `migrate` applied after the restore: the archive was older than the code.
    migrated: list[tuple[str, str]]
    secret_key_matches: bool
    settings_changed: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    @property
    def differences(self) -> dict[str, tuple[int, int | None]]:
        return {label: pair for label, pair in self.counts.items() if pair[0] != pair[1]}


def backup_create(*, output: Path | None = None, now: dt.datetime | None = None) -> Backup:
    """Write an archive of the site, while it runs, and record it.

    The archive is made under a temporary name in the destination's folder and linked to
    its name only when complete: a failed or interrupted backup never leaves a file that
    looks like an archive.
    """
    copier = database_copy()
    created_at = now or timezone.now()
    target = output or settings.CHAT_BACKUP_DIR / f"chatsite-backup-{created_at:%Y%m%dT%H%M%SZ}.tar.gz"
    target = target.resolve()
    if target.exists():
        raise BackupError(f"{target} exists already; choose another name (--output).")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".chatsite-backup-") as work:
        database = Path(work) / copier.file_name
        contents = copier.dump(database)
        manifest = _manifest(copier, contents, database, created_at)
        partial = Path(work) / "archive.tar.gz"
        with tarfile.open(partial, "w:gz") as archive:
            encoded = json.dumps(manifest, indent=2).encode()
            member = tarfile.TarInfo(MANIFEST)
            member.size, member.mtime, member.mode = len(encoded), int(created_at.timestamp()), 0o600
            archive.addfile(member, io.BytesIO(encoded))
            archive.add(database, arcname=copier.file_name)
        partial.chmod(0o600)  # the archive holds every account's data
        _publish(partial, target)
    return Backup.objects.create(created_at=created_at, path=str(target), size_bytes=target.stat().st_size)


def backup_restore(*, archive: Path) -> RestoreReport:
    """Replace the database with an archive's, then migrate it to this code's migrations.

    Refused before anything changes when the archive is not a readable chatsite archive of
    this database's vendor, or was made by newer code (upgrade first, then restore). The
    records of backups are this site's, not the archive's: they are kept.
    """
    copier = database_copy()
    with tempfile.TemporaryDirectory(prefix="chatsite-restore-") as work:
        manifest, database = archive_open(archive, Path(work), copier)
        records = _backup_records()
        copier.load(database)
    call_command("migrate", interactive=False, verbosity=0)
    Backup.objects.all().delete()
    Backup.objects.bulk_create(Backup(**record) for record in records)
    contents = copier.contents()
    archived_migrations = _migrations_of(manifest)
    recorded = manifest.get("settings", {})
    return RestoreReport(
        manifest=manifest,
        counts={label: (count, contents.counts.get(label)) for label, count in manifest["counts"].items()},
        migrated=[migration for migration in contents.migrations if migration not in archived_migrations],
        secret_key_matches=manifest.get("secret_key_fingerprint") == secret_key_fingerprint(),
        settings_changed={
            name: (recorded[name], _setting(name)) for name in recorded if recorded[name] != _setting(name)
        },
    )


def _publish(partial: Path, target: Path) -> None:
    """Give the finished archive its name, never over another file."""
    try:
        os.link(partial, target)  # fails, rather than overwrites, if the name was taken meanwhile
    except FileExistsError:
        raise BackupError(f"{target} exists already; choose another name (--output).") from None
    except OSError:  # a file system without hard links (some network shares)
        if target.exists():
            raise BackupError(f"{target} exists already; choose another name (--output).") from None
        os.replace(partial, target)


def archive_open(archive: Path, work: Path, copier: DatabaseCopy) -> tuple[dict[str, Any], Path]:
    """The archive's manifest, and its database extracted into `work`, once both are checked."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            manifest = _manifest_read(tar, archive)
            _manifest_check(manifest, copier)
            member = tar.extractfile(manifest["database_file"])
            if member is None:
                raise KeyError(manifest["database_file"])
            database = work / copier.file_name
            digest = hashlib.sha256()
            with member, database.open("wb") as file:
                while chunk := member.read(1 << 20):
                    digest.update(chunk)
                    file.write(chunk)
    except FileNotFoundError:
        raise BackupError(f"{archive}: no such file.") from None
    except KeyError as missing:
        raise BackupError(f"{archive} is incomplete: it has no {missing}.") from None
    except (tarfile.TarError, EOFError, zlib.error, OSError) as error:
        raise BackupError(f"{archive} is not a readable chatsite backup (a .tar.gz): {error}") from None
    if digest.hexdigest() != manifest["database_sha256"]:
        raise BackupError(f"{archive} is damaged: its database does not match the checksum in its manifest.")
    return manifest, database


def secret_key_fingerprint() -> str:
    """A one-way fingerprint of SECRET_KEY: equal keys give equal fingerprints, and the
    key cannot be found from it (the key is random, 50 bytes when generated)."""
    return hashlib.sha256(b"chatsite backup fingerprint\0" + settings.SECRET_KEY.encode()).hexdigest()[:16]


def backup_latest() -> Backup | None:
    return Backup.objects.order_by("-created_at", "-pk").first()


def _manifest(copier: DatabaseCopy, contents: Contents, database: Path, created_at: dt.datetime) -> dict[str, Any]:
    applied: dict[str, list[str]] = {}
    for app, name in contents.migrations:  # sorted by name, and names start with their number
        applied.setdefault(app, []).append(name)
    return {
        "format": FORMAT,
        "created_at": created_at.astimezone(dt.UTC).isoformat(),
        "vendor": copier.vendor,
        "django": django.get_version(),
        "database_file": copier.file_name,
        "database_sha256": _sha256(database),
        "database_bytes": database.stat().st_size,
        "latest_migrations": {app: names[-1] for app, names in applied.items()},
        "migrations": applied,
        "counts": contents.counts,
        "settings": {name: _setting(name) for name in RECORDED_SETTINGS},
        "secret_key_fingerprint": secret_key_fingerprint(),
    }


def _manifest_read(tar: tarfile.TarFile, archive: Path) -> dict[str, Any]:
    try:
        member = tar.extractfile(MANIFEST)
    except KeyError:
        raise BackupError(f"{archive} is not a chatsite backup: it has no {MANIFEST}.") from None
    if member is None:
        raise BackupError(f"{archive} is not a chatsite backup: its {MANIFEST} is not a file.")
    try:
        manifest = json.loads(member.read())
    except ValueError:
        raise BackupError(f"{archive} is not a chatsite backup: its {MANIFEST} is not JSON.") from None
    required = {"format", "vendor", "database_file", "database_sha256", "migrations", "counts"}
    if not isinstance(manifest, dict) or not required <= manifest.keys():
        raise BackupError(f"{archive} is not a chatsite backup: its {MANIFEST} lacks {', '.join(sorted(required))}.")
    return manifest


def _manifest_check(manifest: dict[str, Any], copier: DatabaseCopy) -> None:
    if manifest["format"] != FORMAT:
        newer = isinstance(manifest["format"], int) and manifest["format"] > FORMAT
        why = "a newer chatsite: upgrade this one first" if newer else "an unknown program"
        raise BackupError(
            f"The archive's format is {manifest['format']!r}, this chatsite reads {FORMAT}: made by {why}."
        )
    if manifest["vendor"] != copier.vendor:
        raise BackupError(
            f"The archive holds a {manifest['vendor']} database, and this site uses {copier.vendor} "
            "(DATABASE_URL): restore it into a site on the same database."
        )
    if manifest["database_file"] != copier.file_name:
        raise BackupError(f"The archive's database is {manifest['database_file']!r}, expected {copier.file_name!r}.")
    unknown = sorted(_migrations_of(manifest) - _known_migrations())
    if unknown:
        names = ", ".join(f"{app}.{name}" for app, name in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise BackupError(
            f"The archive was made by a newer chatsite: its database has migrations this code does not "
            f"know ({names}). Upgrade this site to that version first, then restore."
        )


def _migrations_of(manifest: dict[str, Any]) -> set[tuple[str, str]]:
    try:
        return {(app, name) for app, names in manifest["migrations"].items() for name in names}
    except (AttributeError, TypeError, ValueError):
        raise BackupError(
            f"The archive's {MANIFEST} is not a chatsite manifest: its migrations are unreadable."
        ) from None


def _known_migrations() -> set[tuple[str, str]]:
    """Every migration of this code, and those that its squashed migrations replace."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    known = set(loader.disk_migrations)
    for migration in loader.disk_migrations.values():
        known.update(migration.replaces)
    return known


def _backup_records() -> list[dict[str, Any]]:
    if Backup._meta.db_table not in connection.introspection.table_names():
        return []
    records = Backup.objects.order_by("created_at", "pk")
    return [{"created_at": r.created_at, "path": r.path, "size_bytes": r.size_bytes} for r in records]


def _setting(name: str) -> Any:
    value = getattr(settings, name, None)
    return value if isinstance(value, str | int | float | bool | None) else str(value)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
