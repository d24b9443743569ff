from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from backups.models import Backup

pytestmark = pytest.mark.django_db


def test_admin_index_says_when_there_is_no_backup_yet(admin_client):
    page = admin_client.get("/admin/")

    assert page.status_code == 200
    assert "No backup yet" in page.content.decode()


def test_admin_index_shows_the_last_backups_time(admin_client):
    now = timezone.now()
    Backup.objects.create(created_at=now - dt.timedelta(days=3), path="/backups/old.tar.gz", size_bytes=10)
    Backup.objects.create(created_at=now - dt.timedelta(hours=2), path="/backups/new.tar.gz", size_bytes=2048)

    page = admin_client.get("/admin/").content.decode()

    assert f'datetime="{(now - dt.timedelta(hours=2)).isoformat()}"' in page
    assert "2\xa0hours ago" in page
    assert "2.0\xa0KB" in page
