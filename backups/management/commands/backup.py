from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.template.defaultfilters import filesizeformat

from backups.databases import BackupError
from backups.services import backup_create


class Command(BaseCommand):
    help = "Write the database (uploaded documents included) into one archive, while the site runs."
    # A backup or restore is wanted most when something is wrong: checks of the model's
    # configuration (CHAT_MODEL, upstreams) must not stand in its way.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--output",
            type=Path,
            help=f"the archive's path (default: chatsite-backup-<UTC time>.tar.gz in {settings.CHAT_BACKUP_DIR})",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            backup = backup_create(output=options["output"])
        except BackupError as error:
            raise CommandError(str(error)) from None
        self.stdout.write(f"Backed up to {backup.path} ({filesizeformat(backup.size_bytes)}).")
