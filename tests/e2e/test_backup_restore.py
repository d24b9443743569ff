"""`manage.py backup` and `restore` as an operator runs them: processes of their own against a
scratch database (an SQLite file, or a new PostgreSQL database beside DATABASE_URL's, dropped
afterwards), on SQLite always and on PostgreSQL when DATABASE_URL names one (CI's services pass)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support import PASSWORD
from tests.support.livesite import ROOT, STARTED, scratch_database

SEED = f"""
from django.contrib.auth.models import User
from accounts.services import api_key_create
from documents.services import document_add
from generation.models import Conversation, Message

alice = User.objects.create_user("alice", password="{PASSWORD}", email="alice@example.com")
bob = User.objects.create_user("bob", password="{PASSWORD}")
conversation = Conversation.objects.create(user=alice, model="smollm2-135m-instruct", title="Tides")
prompt = Message.objects.create(conversation=conversation, role="user", content="Why are there tides?")
Message.objects.create(
    conversation=conversation, parent=prompt, role="assistant", content="The moon pulls the oceans. \\u00e9\\u2603",
    prompt_tokens=7, completion_tokens=9, ttft_ms=120, duration_ms=900,
)
api_key_create(user=alice, name="laptop")
text = "# Tides\\n\\nThe moon's gravity pulls the oceans into two bulges, which the turning earth carries round."
document_add(user=alice, conversation_id=conversation.pk, name="tides.md", kind="markdown", size=len(text), text=text)
"""

# Everything the restore must bring back changes: rows deleted, added and edited.
CHANGE = f"""
from django.contrib.auth.models import User
from accounts.models import ApiKey
from generation.models import Conversation

Conversation.objects.all().delete()
ApiKey.objects.all().delete()
User.objects.create_user("carol", password="{PASSWORD}")
bob = User.objects.get(username="bob")
bob.set_password("another-password-entirely-42")
bob.save()
"""

# The rows of the apps that hold the site's data, and what the documents' search index finds.
SNAPSHOT = """
import io, json
from django.core.management import call_command
from documents.models import Document
from documents.search import passages_search

dump = io.StringIO()
call_command("dumpdata", "auth", "accounts", "generation", "documents", "audit", "sessions", "axes", stdout=dump)
found = passages_search(list(Document.objects.values_list("pk", flat=True)), ["gravity", "oceans"], 4)
print(json.dumps({"rows": json.loads(dump.getvalue()), "found": found}))
"""


def manage(env: dict[str, str], *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    STARTED["manage.py " + command[0]] += 1
    finished = subprocess.run(
        [sys.executable, "manage.py", *command], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    if check and finished.returncode:
        raise AssertionError(f"manage.py {command[0]} exited with {finished.returncode}:\n{finished.stderr}")
    return finished


def snapshot(env: dict[str, str]) -> dict:
    return json.loads(manage(env, "shell", "--no-imports", "-c", SNAPSHOT).stdout)


@contextmanager
def site_environment(vendor: str) -> Iterator[dict[str, str]]:
    """The environment of a site of its own, with a migrated database of `vendor`."""
    with tempfile.TemporaryDirectory(prefix="chatsite-backups-") as folder:
        if vendor == "sqlite":
            database = _sqlite_database(folder)
        elif os.environ.get("DATABASE_URL", "").startswith("postgres"):
            database = scratch_database()
        else:
            pytest.skip("PostgreSQL: set DATABASE_URL=postgres://... (CI's services pass does)")
        with database as url:
            env = {
                **os.environ,
                "DATABASE_URL": url,
                "DJANGO_SECRET_KEY": "backup-test-secret-key-not-for-production-use-0123456789",
                "CHAT_BACKUP_DIR": f"{folder}/backups",
                "LOG_FORMAT": "text",
                "PYTHONUNBUFFERED": "1",
            }
            manage(env, "migrate", "--noinput", "--verbosity", "0")
            yield env


@contextmanager
def _sqlite_database(folder: str) -> Iterator[str]:
    yield f"sqlite:///{folder}/db.sqlite3"


def archives(env: dict[str, str]) -> list[Path]:
    return sorted(Path(env["CHAT_BACKUP_DIR"]).glob("*"))


@pytest.mark.slow
@pytest.mark.parametrize("vendor", ["sqlite", "postgresql"])
def test_backup_then_restore_brings_back_every_row(vendor):
    with site_environment(vendor) as env:
        manage(env, "shell", "--no-imports", "-c", SEED)
        before = snapshot(env)
        assert before["found"], "the document's passage is searchable before the backup"

        backed_up = manage(env, "backup")
        [archive] = archives(env)  # nothing else, no temporary file left behind
        assert f"Backed up to {archive}" in backed_up.stdout
        with tarfile.open(archive) as tar:
            assert sorted(tar.getnames()) == sorted(
                ["manifest.json", json.loads(_member(tar, "manifest.json"))["database_file"]]
            )
            manifest = json.loads(_member(tar, "manifest.json"))
        assert manifest["vendor"] == vendor
        assert manifest["counts"]["auth.user"] == 2
        assert manifest["counts"]["generation.message"] == 2
        assert manifest["counts"]["documents.passage"] >= 1
        assert manifest["latest_migrations"]["backups"] == "0001_initial"
        assert env["DJANGO_SECRET_KEY"].encode() not in gzip.decompress(archive.read_bytes())

        manage(env, "shell", "--no-imports", "-c", CHANGE)
        assert snapshot(env) != before

        restored = manage(env, "restore", "--yes", str(archive))
        assert "differs" not in restored.stdout
        assert "DJANGO_SECRET_KEY" not in restored.stdout  # the same key: sessions stay valid
        assert snapshot(env) == before
        # The record of backups is the site's own: the one just made is still listed.
        listed = manage(
            env, "shell", "--no-imports", "-c", "from backups.models import Backup; print(Backup.objects.get().path)"
        )
        assert listed.stdout.strip() == str(archive)


@pytest.mark.parametrize("vendor", ["sqlite", "postgresql"])
def test_restore_of_an_older_archive_migrates_it(vendor):
    with site_environment(vendor) as env:
        manage(env, "migrate", "sessions", "zero", "--verbosity", "0")
        manage(env, "backup", "--output", f"{env['CHAT_BACKUP_DIR']}/old.tar.gz")
        manage(env, "migrate", "--verbosity", "0")

        restored = manage(env, "restore", "--yes", f"{env['CHAT_BACKUP_DIR']}/old.tar.gz")

        assert "Migrated it to this code: sessions.0001_initial." in restored.stdout
        assert manage(env, "showmigrations", "sessions").stdout.count("[X]") == 1


WRITER = """
import time
from django.contrib.auth.models import User
from generation.models import Conversation, Message

conversation = Conversation.objects.create(user=User.objects.create_user("writer"), model="smollm2-135m-instruct")
print("writing", flush=True)
deadline = time.monotonic() + 8
while time.monotonic() < deadline:
    Message.objects.create(conversation=conversation, role="user", content="x" * 2000)
"""


def test_a_backup_taken_while_the_site_writes_is_consistent():
    with site_environment("sqlite") as env:
        writer = subprocess.Popen(
            [sys.executable, "manage.py", "shell", "--no-imports", "-c", WRITER],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert writer.stdout is not None and writer.stdout.readline().strip() == "writing"
            manage(env, "backup", "--output", f"{env['CHAT_BACKUP_DIR']}/busy.tar.gz")
        finally:
            writer.wait(30)
        assert writer.returncode == 0, "the writer was never refused while the backup ran"

        restored = manage(env, "restore", "--yes", f"{env['CHAT_BACKUP_DIR']}/busy.tar.gz")

        # restore exits non-zero when a count differs from the manifest's, read from the same copy
        message_line = next(line for line in restored.stdout.splitlines() if line.startswith("generation.message "))
        archived, now = message_line.split()[1:3]
        assert archived == now and int(now) > 0


def test_restore_under_another_secret_key_says_everyone_logs_in_again():
    with site_environment("sqlite") as env:
        manage(env, "backup", "--output", f"{env['CHAT_BACKUP_DIR']}/site.tar.gz")

        other_key = {**env, "DJANGO_SECRET_KEY": "another-secret-key-for-the-new-machine-0123456789"}
        restored = manage(other_key, "restore", "--yes", f"{env['CHAT_BACKUP_DIR']}/site.tar.gz")

        assert "everyone must log in again" in restored.stdout
        assert other_key["DJANGO_SECRET_KEY"] not in restored.stdout + restored.stderr


def test_a_failed_backup_exits_non_zero_and_leaves_no_archive():
    with site_environment("sqlite") as env:
        manage(env, "backup", "--output", f"{env['CHAT_BACKUP_DIR']}/site.tar.gz")

        again = manage(env, "backup", "--output", f"{env['CHAT_BACKUP_DIR']}/site.tar.gz", check=False)

        assert again.returncode == 1
        assert "exists already" in again.stderr
        assert [path.name for path in archives(env)] == ["site.tar.gz"]


def _member(tar: tarfile.TarFile, name: str) -> bytes:
    member = tar.extractfile(name)
    assert member is not None
    return member.read()
