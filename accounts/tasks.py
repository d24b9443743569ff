"""Celery tasks of the accounts app; Celery beat schedules them."""

from __future__ import annotations

from celery import shared_task

from accounts.services import usage_rollup


@shared_task(name="accounts.usage_rollup", ignore_result=True)
def usage_rollup_task() -> int:
    """Roll the last two UTC days of the usage ledger up into UsageDay; the rows written."""
    return usage_rollup()
