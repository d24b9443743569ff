"""Celery tasks of the audit trail; Celery beat schedules them."""

from __future__ import annotations

from celery import shared_task

from audit.services import audit_purge


@shared_task(name="audit.purge", ignore_result=True)
def audit_purge_task() -> int:
    """Delete the records older than CHAT_AUDIT_RETENTION_DAYS; how many went."""
    return audit_purge()
