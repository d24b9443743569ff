"""Budget alerts (accounts.alerts): one per budget, subject, period and kind, however many
requests cross at once; posted to a real local webhook off the request path, retried, and
e-mailed to staff and the owner."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core import mail
from django.db import transaction
from django.utils import timezone

from accounts import alerts
from accounts.budgets import budget_standings
from accounts.models import BudgetAlert
from accounts.services import QuotaExceeded, api_key_create
from accounts.tasks import alert_resend_task
from tests.accounts.budget_helpers import admit, budget, roomy, use
from tests.accounts.test_group_commit import at_once

pytestmark = pytest.mark.django_db(transaction=True)


@dataclass
class Webhook:
    url: str
    failures: list[int] = field(default_factory=list)  # statuses to answer first, in turn
    posts: list[tuple[int, dict[str, str], str]] = field(default_factory=list)  # (status, body, content type)

    def texts(self) -> list[str]:
        return [body["text"] for status, body, _ in self.posts if status == 200]


@pytest.fixture
def webhook(settings) -> Iterator[Webhook]:
    """A real HTTP server on a free local port, recording what it is posted."""
    hook = Webhook(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status = hook.failures.pop(0) if hook.failures else 200
            hook.posts.append((status, body, self.headers["Content-Type"]))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hook.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/budget"
    settings.CHAT_ALERT_WEBHOOK_URL = hook.url
    yield hook
    alerts.alerts_wait(15)
    server.shutdown()
    server.server_close()


def test_crossing_the_soft_limit_posts_one_alert_to_the_webhook(alice, webhook):
    budget(account=roomy(alice), amount=100, soft_limit_percent=80)
    use(alice, 70)
    assert alerts.alerts_wait() and webhook.posts == []

    use(alice, 20)
    use(alice, 5)

    assert alerts.alerts_wait()
    [(status, body, content_type)] = webhook.posts
    assert status == 200
    assert content_type == "application/json"
    assert set(body) == {"text"}
    assert body["text"].startswith("Budget at 80%: user alice has used 90 tokens of 100 tokens today")
    assert BudgetAlert.objects.get().delivered_at is not None


def test_fifty_requests_crossing_the_soft_limit_at_once_make_one_alert(alice, webhook):
    budget(account=roomy(alice), amount=10_000, soft_limit_percent=50)  # crossed by the 46th of 110 tokens

    outcomes = at_once(50, lambda _: admit(alice, prompt_tokens=10, max_tokens=100))

    assert all(isinstance(outcome, tuple) for outcome in outcomes)
    assert BudgetAlert.objects.filter(kind=BudgetAlert.Kind.SOFT_LIMIT).count() == 1
    assert alerts.alerts_wait()
    assert len(webhook.posts) == 1


def test_fifty_requests_racing_for_one_alert_record_it_once(alice):
    """The unique row alone, without the admission's locks: one of fifty inserts wins."""
    account = roomy(alice)
    budget(account=account, amount=100, soft_limit_percent=10)
    [standing] = budget_standings(account=account, now=timezone.now())

    def record(_: int) -> BudgetAlert | None:
        with transaction.atomic():
            return alerts.alert_record(standing=standing, kind=BudgetAlert.Kind.SOFT_LIMIT)

    outcomes = at_once(50, record)

    assert len([outcome for outcome in outcomes if isinstance(outcome, BudgetAlert)]) == 1
    assert outcomes.count(None) == 49
    assert BudgetAlert.objects.count() == 1


def test_a_spent_budget_alerts_once_however_many_requests_it_refuses(alice, webhook):
    budget(account=roomy(alice), amount=20)  # no soft limit: only the alert when spent
    use(alice, 20)

    refusals = []
    for _ in range(5):
        with pytest.raises(QuotaExceeded) as refused:
            admit(alice, prompt_tokens=1)
        refusals.append(refused.value)

    assert {refusal.code for refusal in refusals} == {"insufficient_quota"}
    assert alerts.alerts_wait()
    assert [alert.kind for alert in BudgetAlert.objects.all()] == [BudgetAlert.Kind.EXHAUSTED]
    [text] = webhook.texts()
    assert text.startswith("Budget spent: user alice has used 20 tokens of 20 tokens today")


def test_the_webhook_is_tried_again_with_back_off_until_it_answers(alice, webhook, monkeypatch):
    monkeypatch.setattr(alerts, "RETRY_DELAYS_S", (0.05, 0.1, 0.2))
    webhook.failures = [500, 503]
    budget(account=roomy(alice), amount=100, soft_limit_percent=50)

    use(alice, 60)

    assert alerts.alerts_wait()
    assert [status for status, _, _ in webhook.posts] == [500, 503, 200]
    assert BudgetAlert.objects.get().delivered_at is not None


def test_a_webhook_that_is_down_delays_no_request(alice, settings, monkeypatch):
    # A server that takes connections and never answers: each attempt waits for its timeout.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    settings.CHAT_ALERT_WEBHOOK_URL = f"http://127.0.0.1:{silent.getsockname()[1]}/hook"
    monkeypatch.setattr(alerts, "WEBHOOK_TIMEOUT_S", 2.0)
    monkeypatch.setattr(alerts, "RETRY_DELAYS_S", (0.1,))
    budget(account=roomy(alice), amount=100, soft_limit_percent=10)
    try:
        started = time.monotonic()
        use(alice, 20)  # crosses the soft limit
        use(alice, 20)
        took = time.monotonic() - started

        # Waiting for the webhook would take its first attempt's 2 s at least; the two
        # requests alone take milliseconds, and the bound leaves room for a busy machine.
        assert took < 2.0
        assert BudgetAlert.objects.get().delivered_at is None  # still being tried
        assert alerts.alerts_wait(15)
        assert BudgetAlert.objects.get().delivered_at is None  # given up: left undelivered
    finally:
        silent.close()


def test_alerts_are_emailed_to_staff_and_the_owner(alice, bob, django_user_model, settings):
    settings.CHAT_EMAIL = True
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.CHAT_ALERT_WEBHOOK_URL = ""
    django_user_model.objects.create_user("admin", email="admin@example.com", is_staff=True)
    alice.email, bob.email = "alice@example.com", "bob@example.com"
    alice.save()
    bob.save()
    roomy(alice)
    key, _ = api_key_create(user=alice, name="service")
    budget(api_key=key, amount=100, soft_limit_percent=50)

    use(alice, 60, api_key=key)

    assert alerts.alerts_wait()
    [message] = mail.outbox
    assert sorted(message.to) == ["admin@example.com", "alice@example.com"]
    assert "Budget at 50%: key service" in message.body
    assert BudgetAlert.objects.get().delivered_at is not None


def test_an_alert_left_undelivered_is_sent_again_later_once(alice, webhook, monkeypatch):
    monkeypatch.setattr(alerts, "RETRY_DELAYS_S", ())
    webhook.failures = [500]  # down for the first round
    budget(account=roomy(alice), amount=100, soft_limit_percent=50)
    use(alice, 60)
    assert alerts.alerts_wait()
    alert = BudgetAlert.objects.get()
    assert alert.delivered_at is None

    soon = alerts.alert_resend(now=alert.attempted_at + alerts.RESEND_AFTER / 2)
    later = alert.attempted_at + alerts.RESEND_AFTER * 1.5
    resent = [alerts.alert_resend(now=later), alerts.alert_resend(now=later)]  # two housekeepers at once

    assert alerts.alerts_wait()
    assert (soon, resent) == (0, [1, 0])
    assert [status for status, _, _ in webhook.posts] == [500, 200]
    assert BudgetAlert.objects.get().delivered_at is not None


def test_housekeeping_sends_undelivered_alerts_again(settings):
    assert alert_resend_task.name == "accounts.alert_resend"
    assert "accounts.alert_resend" in {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert alert_resend_task() == 0  # nothing left undelivered
