"""Celery tasks of the accounts app; Celery beat schedules them."""

from __future__ import annotations

from celery import shared_task

from accounts.alerts import alert_resend
from accounts.services import guest_purge, usage_rollup


@shared_task(name="accounts.usage_rollup", ignore_result=True)
def usage_rollup_task() -> int:
    """Roll the last two UTC days of the usage ledger up into UsageDay; the rows written."""
    return usage_rollup()


@shared_task(name="accounts.guest_purge", ignore_result=True)
def guest_purge_task() -> int:
    """Delete the guests idle for CHAT_GUEST_TTL_DAYS; how many went."""
    return guest_purge()


@shared_task(name="accounts.alert_resend", ignore_result=True)
def alert_resend_task() -> int:
    """Send again the budget alerts left undelivered; how many."""
    return alert_resend()
