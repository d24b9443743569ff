from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from backups.databases import BackupError
from backups.services import RestoreReport, backup_restore


class Command(BaseCommand):
    help = "Replace the database with a backup archive's, then migrate it (stop the site first)."
    # A backup or restore is wanted most when something is wrong: checks of the model's
    # configuration (CHAT_MODEL, upstreams) must not stand in its way.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("archive", type=Path, help="an archive written by manage.py backup")
        parser.add_argument("--yes", action="store_true", help="replace this site's database: everything in it now")

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["yes"]:
            raise CommandError(
                "restore replaces the whole database with the archive's: whatever was written since is lost. "
                "Stop the site, then run it again with --yes."
            )
        try:
            report = backup_restore(archive=options["archive"])
        except BackupError as error:
            raise CommandError(str(error)) from None
        self._report(report)
        if report.differences and not report.migrated:
            raise CommandError("Rows differ from the archive's counts (above): the restore is not complete.")

    def _report(self, report: RestoreReport) -> None:
        self.stdout.write(f"Restored the backup made at {report.manifest.get('created_at', '?')}.")
        if report.migrated:
            names = ", ".join(f"{app}.{name}" for app, name in report.migrated)
            self.stdout.write(f"Migrated it to this code: {names}.")
        self.stdout.write(f"{'rows':<36} {'archive':>9} {'now':>9}")
        for label, (archived, now) in report.counts.items():
            mark = "" if archived == now else "  <- differs"
            self.stdout.write(f"{label:<36} {archived:>9} {'-' if now is None else now:>9}{mark}")
        if report.differences and report.migrated:
            self.stdout.write("Some counts differ: the migrations above may have changed those rows.")
        for name, (archived, now) in report.settings_changed.items():
            self.stdout.write(f"Note: {name} was {archived!r} when the backup was made, and is {now!r} here.")
        if not report.secret_key_matches:
            self.stdout.write(
                "Note: this site's DJANGO_SECRET_KEY is not the one of the site backed up: everyone must log in "
                "again, and password-reset links sent before stop working. To keep them, set DJANGO_SECRET_KEY "
                "to the old site's key (its .env.local, when it was generated) and restart."
            )
