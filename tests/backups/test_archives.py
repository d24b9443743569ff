"""What `restore` refuses before it touches the database: these tests have no database
access at all (pytest-django would fail any), so a refusal that came too late fails them."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from backups.databases import BackupError, database_copy
from backups.services import FORMAT, archive_open

MANIFEST_NAME = "manifest.json"
DATABASE = b"not really a database, but its checksum matches"


def write_archive(path: Path, *, database: bytes = DATABASE, **manifest: Any) -> Path:
    copier = database_copy()
    fields = {
        "format": FORMAT,
        "created_at": "2026-01-01T00:00:00+00:00",
        "vendor": copier.vendor,
        "database_file": copier.file_name,
        "database_sha256": hashlib.sha256(DATABASE).hexdigest(),
        "migrations": {"auth": ["0001_initial"]},
        "counts": {},
        **manifest,
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, data in ((MANIFEST_NAME, json.dumps(fields).encode()), (copier.file_name, database)):
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    return path


def restore_error(archive: Path) -> str:
    with pytest.raises(CommandError) as refused:
        call_command("restore", str(archive), yes=True)
    return str(refused.value)


def test_a_well_formed_archive_is_opened_and_its_database_extracted(tmp_path):
    manifest, database = archive_open(write_archive(tmp_path / "good.tar.gz"), tmp_path, database_copy())

    assert manifest["migrations"] == {"auth": ["0001_initial"]}
    assert database.read_bytes() == DATABASE


def test_restore_without_yes_refuses_and_says_what_it_would_replace(tmp_path):
    with pytest.raises(CommandError, match=r"replaces the whole database.*--yes"):
        call_command("restore", str(write_archive(tmp_path / "good.tar.gz")))


def test_a_file_that_is_not_an_archive_is_refused(tmp_path):
    foreign = tmp_path / "photo.tar.gz"
    foreign.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200))

    assert "is not a readable chatsite backup" in restore_error(foreign)


def test_a_tar_without_a_manifest_is_refused(tmp_path):
    foreign = tmp_path / "other.tar.gz"
    with tarfile.open(foreign, "w:gz") as tar:
        tar.addfile(tarfile.TarInfo("readme.txt"), io.BytesIO(b""))

    assert "not a chatsite backup: it has no manifest.json" in restore_error(foreign)


def test_a_truncated_archive_is_refused(tmp_path):
    archive = write_archive(tmp_path / "good.tar.gz")
    archive.write_bytes(archive.read_bytes()[:60])

    assert "is not a readable chatsite backup" in restore_error(archive)


def test_a_database_that_does_not_match_its_checksum_is_refused(tmp_path):
    archive = write_archive(tmp_path / "damaged.tar.gz", database=DATABASE.replace(b"really", b"REALLY"))

    assert "is damaged" in restore_error(archive)


def test_an_archive_with_migrations_newer_than_the_code_is_refused(tmp_path):
    archive = write_archive(tmp_path / "new.tar.gz", migrations={"accounts": ["0001_initial", "9999_from_the_future"]})

    message = restore_error(archive)

    assert "newer chatsite" in message
    assert "accounts.9999_from_the_future" in message
    assert "Upgrade this site" in message


def test_an_archive_of_a_later_format_is_refused(tmp_path):
    assert "upgrade this one first" in restore_error(write_archive(tmp_path / "v2.tar.gz", format=FORMAT + 1))


def test_an_archive_of_another_database_vendor_is_refused(tmp_path):
    other = "postgresql" if database_copy().vendor == "sqlite" else "sqlite"

    assert f"holds a {other} database" in restore_error(write_archive(tmp_path / "other.tar.gz", vendor=other))


def test_a_missing_archive_is_named(tmp_path):
    assert "no such file" in restore_error(tmp_path / "missing.tar.gz")


def test_archive_errors_are_backup_errors(tmp_path):
    with pytest.raises(BackupError):
        archive_open(tmp_path / "missing.tar.gz", tmp_path, database_copy())
