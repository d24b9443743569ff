from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from backups.models import Backup


@admin.register(Backup)
class BackupAdmin(admin.ModelAdmin):
    list_display = ["created_at", "path", "size_bytes"]
    date_hierarchy = "created_at"

    # Written by `manage.py backup` alone; a record deleted here leaves its archive alone.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
