from __future__ import annotations

from django import template

from backups.models import Backup
from backups.services import backup_latest

register = template.Library()


@register.simple_tag
def last_backup() -> Backup | None:
    """The newest archive `manage.py backup` recorded, or None."""
    return backup_latest()
