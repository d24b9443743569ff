"""Budget alerts: once per budget, subject, period and kind, sent off the request path.

`alert_record` runs inside admission's transaction: the row's unique constraint
(BudgetAlert: budget_alert_once) makes the first request past a threshold the only one to
earn an alert, however many cross it at once. Once that transaction commits, the alert's
id is handed to this process's sender thread (`alert_dispatch` never waits), which posts
`{"text": ...}` to CHAT_ALERT_WEBHOOK_URL, retried with back-off, and e-mails staff and the
owner when e-mail is set up. A thread rather than a Celery task: with the in-process
backend Celery runs tasks eagerly, on the request's own thread. An alert the process did
not live to deliver, or whose webhook stayed down through its retries, is begun again by
`alert_resend` (beat's schedule) ten minutes on, for a day.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import queue
import threading
import time
import urllib.request
from decimal import Decimal

from django.conf import settings
from django.contrib.auth.models import User
from django.core.mail import send_mail
from django.db import IntegrityError, connections, transaction
from django.db.models import Q
from django.utils import timezone

from accounts.budgets import PERIOD_PHRASES, BudgetStanding, budget_zone
from accounts.models import ApiKey, Budget, BudgetAlert, Team
from accounts.prices import cost_shown

logger = logging.getLogger(__name__)

# Seconds before each further attempt at the webhook: five attempts over about a minute.
RETRY_DELAYS_S = (1.0, 4.0, 15.0, 40.0)
WEBHOOK_TIMEOUT_S = 5.0
# Alerts waiting for the sender; beyond this (a webhook down for long), new ones are left
# undelivered rather than held in memory.
QUEUE_SIZE = 1000
# An undelivered alert is tried again (alert_resend, on beat's schedule) this long after its
# last round began, for as long as it is younger than RESEND_WITHIN.
RESEND_AFTER = dt.timedelta(minutes=10)
RESEND_WITHIN = dt.timedelta(days=1)


def alert_record(*, standing: BudgetStanding, kind: str) -> BudgetAlert | None:
    """Record an alert for `standing` unless its period has one of that kind already; sent
    once the surrounding transaction commits. None if it was recorded before."""
    budget, window = standing.budget, standing.window
    once = {"budget": budget, "subject": standing.subject, "period_start": window.alert_key, "kind": kind}
    if BudgetAlert.objects.filter(**once).exists():  # the usual case past a threshold: no write
        return None
    text = _alert_text(standing, kind)
    try:
        with transaction.atomic():  # a savepoint: a lost race undoes only this insert
            alert = BudgetAlert.objects.create(**once, used=standing.used, text=text, attempted_at=timezone.now())
    except IntegrityError:
        return None
    transaction.on_commit(lambda: alert_dispatch(alert.pk))
    return alert


def alerts_for(standings: list[BudgetStanding]) -> None:
    """Record the soft-limit alerts these standings (after an admission) have earned."""
    for standing in standings:
        soft = standing.soft_limit
        if soft is not None and standing.used >= soft:
            alert_record(standing=standing, kind=BudgetAlert.Kind.SOFT_LIMIT)


def alert_resend(*, now: dt.datetime | None = None) -> int:
    """Begin again the delivery of the alerts of the last RESEND_WITHIN whose last round
    began RESEND_AFTER ago or more and did not deliver them (a webhook down longer than
    its retries, a process gone); each is claimed by one caller only. How many."""
    now = now or timezone.now()
    stale = Q(delivered_at__isnull=True, created_at__gte=now - RESEND_WITHIN, attempted_at__lt=now - RESEND_AFTER)
    resent = 0
    for alert_id in BudgetAlert.objects.filter(stale).values_list("pk", flat=True):
        if BudgetAlert.objects.filter(stale, pk=alert_id).update(attempted_at=now):  # claimed
            alert_dispatch(alert_id)
            resent += 1
    return resent


def alert_dispatch(alert_id: int) -> None:
    """Hand an alert to the sender thread; never waits."""
    try:
        _sender().put_nowait(alert_id)
    except queue.Full:
        logger.warning("Budget alert %s left undelivered: %s alerts wait already.", alert_id, QUEUE_SIZE)


def alert_deliver(alert_id: int) -> bool:
    """Send one alert by webhook and e-mail (the sender thread's work); whether it went."""
    alert = BudgetAlert.objects.select_related("budget").filter(pk=alert_id).first()
    if alert is None or alert.delivered_at is not None:
        return True
    delivered = True
    if settings.CHAT_ALERT_WEBHOOK_URL:
        delivered = webhook_post(settings.CHAT_ALERT_WEBHOOK_URL, {"text": alert.text})
    if settings.CHAT_EMAIL:
        recipients = _recipients(alert)
        if recipients:
            try:
                send_mail(f"[chatsite] {alert.text[:120]}", alert.text, None, recipients)
            except Exception:
                logger.exception("Budget alert %s: the e-mail could not be sent.", alert_id)
                delivered = False
    if delivered:
        BudgetAlert.objects.filter(pk=alert_id).update(delivered_at=timezone.now())
    return delivered


def webhook_post(url: str, payload: dict[str, str]) -> bool:
    """POST `payload` as JSON, again after each of RETRY_DELAYS_S while it fails; whether it went."""
    body = json.dumps(payload).encode()
    for attempt, delay in enumerate((*RETRY_DELAYS_S, None), start=1):
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT_S) as response:
                if 200 <= response.status < 300:
                    return True
        except OSError as error:  # URLError and HTTPError are OSErrors
            logger.warning("Budget alert webhook, attempt %s: %s", attempt, error)
        if delay is not None:
            time.sleep(delay)
    return False


def _alert_text(standing: BudgetStanding, kind: str) -> str:
    budget = standing.budget
    subject = {"plan": "user", "account": "user", "key": "key", "team": "team"}[budget.subject_kind]
    who = _subject_name(standing.subject)

    def amount(value: Decimal) -> str:
        if budget.unit == Budget.Unit.TOKENS:
            return f"{int(value):,} tokens"
        return f"{cost_shown(value)} {budget.currency}"

    since = standing.window.start.astimezone(budget_zone()).isoformat(timespec="minutes")
    used = f"{amount(standing.used)} of {amount(budget.amount)} {PERIOD_PHRASES[budget.period]} (since {since})"
    if kind == BudgetAlert.Kind.EXHAUSTED:
        return f"Budget spent: {subject} {who} has used {used}; its requests are refused until it resets."
    return f"Budget at {budget.soft_limit_percent}%: {subject} {who} has used {used}."


def _subject_name(subject: str) -> str:
    kind, _, pk = subject.partition(":")
    if kind == "user":
        return User.objects.filter(pk=pk).values_list("username", flat=True).first() or subject
    if kind == "key":
        key = ApiKey.objects.filter(pk=pk).first()
        return str(key) if key else subject
    team = Team.objects.filter(pk=pk).first()
    return str(team) if team else subject


def _recipients(alert: BudgetAlert) -> list[str]:
    """Staff, and the owner: the user of a user's budget, the maker of a key."""
    users = User.objects.filter(is_staff=True, is_active=True)
    kind, _, pk = alert.subject.partition(":")
    if kind == "user":
        users = users | User.objects.filter(pk=pk)
    elif kind == "key":
        users = users | User.objects.filter(api_keys__pk=pk)
    return sorted({email for email in users.values_list("email", flat=True) if email})


class _Sender:
    """One daemon thread per process that delivers alerts in turn."""

    def __init__(self) -> None:
        self.queue: queue.Queue[int] = queue.Queue(QUEUE_SIZE)
        self.thread = threading.Thread(target=self._run, name="budget-alerts", daemon=True)
        self.thread.start()

    def put_nowait(self, alert_id: int) -> None:
        self.queue.put_nowait(alert_id)

    def _run(self) -> None:
        while True:
            alert_id = self.queue.get()
            try:
                alert_deliver(alert_id)
            except Exception:
                logger.exception("Budget alert %s could not be delivered.", alert_id)
            finally:
                connections.close_all()  # this thread's own: none is kept open between alerts
                self.queue.task_done()


_sender_lock = threading.Lock()
_the_sender: _Sender | None = None


def _sender() -> _Sender:
    global _the_sender
    with _sender_lock:
        if _the_sender is None:
            _the_sender = _Sender()
        return _the_sender


def alerts_wait(timeout: float = 10.0) -> bool:
    """Wait until the sender has nothing left to send (for tests); whether it finished in time."""
    sender = _the_sender
    if sender is None:  # nothing was ever sent by this process
        return True
    deadline = time.monotonic() + timeout
    while sender.queue.unfinished_tasks:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
