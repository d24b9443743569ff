"""The record of each archive `manage.py backup` wrote, for the admin's "last backup" line."""

from __future__ import annotations

from django.db import models


class Backup(models.Model):
    """An archive written by `manage.py backup` (the file may since have been moved or pruned)."""

    created_at = models.DateTimeField(db_index=True)
    path = models.CharField(max_length=1000)
    size_bytes = models.PositiveBigIntegerField()

    class Meta:
        ordering = ["-created_at", "-pk"]
        get_latest_by = "created_at"

    def __str__(self) -> str:
        return self.path
