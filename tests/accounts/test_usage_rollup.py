from __future__ import annotations

import datetime as dt
import re
import uuid

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from accounts.models import UsageDay, UsageRecord
from accounts.services import usage_finish, usage_rollup
from accounts.tasks import usage_rollup_task

pytestmark = pytest.mark.django_db

UTC = dt.UTC
NOW = dt.datetime(2025, 3, 2, 12, tzinfo=UTC)
MARCH_1 = dt.date(2025, 3, 1)
MARCH_2 = dt.date(2025, 3, 2)


def record(user, at: dt.datetime, *, prompt: int = 0, completion: int = 0, **fields) -> UsageRecord:
    fields = {"channel": "api", "model": "synthetic", "status": "complete", **fields}
    return UsageRecord.objects.create(
        user=user,
        stream_id=uuid.uuid4().hex,
        prompt_tokens=prompt,
        completion_tokens=completion,
        created_at=at,
        **fields,
    )


def rolled_up() -> dict[tuple, tuple[int, int, int]]:
    """UsageDay as {(day, username, model, channel): (requests, prompt, completion)}."""
    return {
        (row.day, row.user.username, row.model, row.channel): (row.requests, row.prompt_tokens, row.completion_tokens)
        for row in UsageDay.objects.select_related("user")
    }


def daily_rows(page: str) -> dict[str, list[int]]:
    rows = re.findall(r'<tr data-day="([^"]+)">(.*?)</tr>', page, re.S)
    return {day: [int(cell) for cell in re.findall(r"<td>(\d+)</td>", cells)] for day, cells in rows}


def test_rollup_totals_match_the_records_per_day_user_model_and_channel(alice, bob):
    last_moment_of_march_1 = dt.datetime(2025, 3, 1, 23, 59, 59, 999999, tzinfo=UTC)
    midnight = dt.datetime(2025, 3, 2, tzinfo=UTC)
    record(alice, last_moment_of_march_1, prompt=10, completion=20)
    record(alice, dt.datetime(2025, 3, 1, 8, tzinfo=UTC), prompt=1, completion=2)
    record(alice, midnight, prompt=100, completion=200)
    record(alice, midnight, prompt=5, completion=6, channel="ui")
    record(alice, midnight, prompt=7, completion=8, model="smollm2-135m-instruct")
    record(bob, last_moment_of_march_1, prompt=1000, completion=2000, channel="ws")
    record(bob, dt.datetime(2025, 3, 2, 11, tzinfo=UTC), prompt=3, completion=4, channel="ws")

    written = usage_rollup(now=NOW)

    assert rolled_up() == {
        (MARCH_1, "alice", "synthetic", "api"): (2, 11, 22),
        (MARCH_2, "alice", "synthetic", "api"): (1, 100, 200),
        (MARCH_2, "alice", "synthetic", "ui"): (1, 5, 6),
        (MARCH_2, "alice", "smollm2-135m-instruct", "api"): (1, 7, 8),
        (MARCH_1, "bob", "synthetic", "ws"): (1, 1000, 2000),
        (MARCH_2, "bob", "synthetic", "ws"): (1, 3, 4),
    }
    assert written == 6
    assert UsageDay.objects.get(day=MARCH_1, user=bob).total_tokens == 3000


def test_rollup_days_are_utc_days_whatever_the_time_zone(settings, alice):
    settings.TIME_ZONE = "Pacific/Auckland"  # 13 hours ahead of UTC in March: already March 2 there
    record(alice, dt.datetime(2025, 3, 1, 23, 30, tzinfo=UTC), prompt=1, completion=2)
    usage_rollup(now=NOW)
    assert rolled_up() == {(MARCH_1, "alice", "synthetic", "api"): (1, 1, 2)}


def test_rollup_counts_a_streaming_record_as_a_request_without_its_completion_tokens(alice):
    record(alice, NOW, prompt=12, completion=30, status="streaming", reserved_tokens=256)
    usage_rollup(now=NOW)
    assert rolled_up() == {(MARCH_2, "alice", "synthetic", "api"): (1, 12, 0)}


def test_running_the_rollup_twice_changes_nothing(alice, bob):
    record(alice, dt.datetime(2025, 3, 1, 9, tzinfo=UTC), prompt=10, completion=20)
    record(bob, NOW, prompt=1, completion=2, channel="ui")
    fields = ["pk", "day", "user", "model", "channel", "requests", "prompt_tokens", "completion_tokens"]
    first = usage_rollup(now=NOW)
    before = list(UsageDay.objects.order_by("pk").values(*fields))

    second = usage_rollup(now=NOW)

    assert first == second == 2
    assert list(UsageDay.objects.order_by("pk").values(*fields)) == before


def test_a_record_finishing_after_a_rollup_is_counted_in_the_next(alice):
    running = record(alice, NOW, prompt=12, status="streaming")
    usage_rollup(now=NOW)
    assert rolled_up() == {(MARCH_2, "alice", "synthetic", "api"): (1, 12, 0)}

    usage_finish(
        stream_id=running.stream_id,
        status="complete",
        finish_reason="stop",
        prompt_tokens=12,
        completion_tokens=40,
        ttft_ms=30,
        duration_ms=900,
    )
    usage_rollup(now=NOW + dt.timedelta(minutes=1))

    assert rolled_up() == {(MARCH_2, "alice", "synthetic", "api"): (1, 12, 40)}


def test_rollup_leaves_days_outside_the_window_alone(alice):
    before = dt.date(2025, 2, 28)
    after = dt.date(2025, 3, 3)
    UsageDay.objects.create(day=before, user=alice, model="synthetic", channel="api", requests=9, prompt_tokens=9)
    UsageDay.objects.create(day=after, user=alice, model="synthetic", channel="api", requests=8, prompt_tokens=8)
    # Records on those days, which a rollup of them would count differently.
    record(alice, dt.datetime(2025, 2, 28, 23, 59, tzinfo=UTC), prompt=1)
    record(alice, dt.datetime(2025, 3, 3, tzinfo=UTC), prompt=1)
    record(alice, NOW, prompt=5)

    assert usage_rollup(days=2, now=NOW) == 1

    assert rolled_up() == {
        (before, "alice", "synthetic", "api"): (9, 9, 0),
        (MARCH_2, "alice", "synthetic", "api"): (1, 5, 0),
        (after, "alice", "synthetic", "api"): (8, 8, 0),
    }


def test_rollup_deletes_rows_in_the_window_whose_records_are_gone(alice, bob):
    kept = record(alice, NOW, prompt=5)
    gone = record(bob, dt.datetime(2025, 3, 1, 9, tzinfo=UTC), prompt=7)
    usage_rollup(now=NOW)
    gone.delete()

    assert usage_rollup(now=NOW) == 1

    assert rolled_up() == {(MARCH_2, "alice", "synthetic", "api"): (1, kept.prompt_tokens, 0)}


def test_rollup_task_rolls_up_today_and_returns_the_row_count(alice, bob):
    record(alice, timezone.now(), prompt=3, completion=4)
    record(bob, timezone.now(), prompt=1, completion=1, channel="ws")

    assert usage_rollup_task.apply().get() == 2

    assert UsageDay.objects.count() == 2
    assert usage_rollup_task.name == "accounts.usage_rollup"


def test_daily_view_shows_the_rolled_up_totals_and_when_they_were_updated(admin_client, alice, bob):
    record(alice, dt.datetime(2025, 3, 1, 9, tzinfo=UTC), prompt=10, completion=20)
    record(bob, dt.datetime(2025, 3, 1, 23, 59, tzinfo=UTC), prompt=1, completion=2, channel="ws")
    record(alice, dt.datetime(2025, 3, 2, 0, 0, tzinfo=UTC), prompt=100, completion=200)
    record(alice, NOW, prompt=50, completion=999, status="streaming")
    usage_rollup(now=NOW)
    updated_at = UsageDay.objects.latest("updated_at").updated_at

    page = admin_client.get(reverse("admin:accounts_usagerecord_daily")).content.decode()

    assert daily_rows(page) == {
        "2025-03-02": [2, 150, 200, 350],
        "2025-03-01": [2, 11, 22, 33],
        "total": [4, 161, 222, 383],
    }
    assert "rolled up from the usage records every minute by Celery beat" in page
    assert f'<time datetime="{updated_at.isoformat()}">' in page


def test_daily_view_says_when_nothing_is_rolled_up_yet(admin_client, alice):
    record(alice, NOW, prompt=1, completion=2)
    page = admin_client.get(reverse("admin:accounts_usagerecord_daily")).content.decode()
    assert daily_rows(page) == {}
    assert "not rolled up yet" in page


def test_daily_view_follows_the_changelist_date_filters(admin_client, alice):
    record(alice, dt.datetime(2025, 3, 1, 9, tzinfo=UTC), prompt=10, completion=20)
    record(alice, NOW, prompt=100, completion=200)
    usage_rollup(now=NOW)
    url = reverse("admin:accounts_usagerecord_daily")

    hierarchy = admin_client.get(url, {"created_at__year": 2025, "created_at__month": 3, "created_at__day": 1})
    since = admin_client.get(url, {"created_at__gte": "2025-03-02 00:00:00+00:00"})

    assert daily_rows(hierarchy.content.decode()) == {"2025-03-01": [1, 10, 20, 30], "total": [1, 10, 20, 30]}
    assert daily_rows(since.content.decode()) == {"2025-03-02": [1, 100, 200, 300], "total": [1, 100, 200, 300]}


def test_daily_view_names_the_filters_it_cannot_apply(admin_client, alice):
    record(alice, NOW, prompt=1, completion=2)
    usage_rollup(now=NOW)
    page = admin_client.get(
        reverse("admin:accounts_usagerecord_daily"), {"status__exact": "error", "q": "alice", "channel__exact": "api"}
    ).content.decode()
    assert re.search(r'data-role="ignored">[^<]*search, status\.', page)
    assert daily_rows(page) == {"2025-03-02": [1, 1, 2, 3], "total": [1, 1, 2, 3]}


def test_anonymous_visitors_are_sent_to_the_admin_login(client):
    response = client.get(reverse("admin:accounts_usagerecord_daily"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_non_staff_users_cannot_read_anyones_totals(alice_client, bob):
    record(bob, NOW, prompt=4242, completion=1717)
    usage_rollup(now=NOW)
    response = alice_client.get(reverse("admin:accounts_usagerecord_daily"), {"user": bob.pk})
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))
    assert b"4242" not in response.content


def test_staff_without_permission_to_view_usage_are_refused(django_user_model, bob):
    record(bob, NOW, prompt=4242, completion=1717)
    usage_rollup(now=NOW)
    carol = django_user_model.objects.create_user("carol", password="x", is_staff=True)
    client = Client()
    client.force_login(carol)
    assert client.get(reverse("admin:accounts_usagerecord_daily")).status_code == 403

    carol.user_permissions.add(Permission.objects.get(codename="view_usagerecord"))
    page = client.get(reverse("admin:accounts_usagerecord_daily")).content.decode()
    assert daily_rows(page)["total"] == [1, 4242, 1717, 5959]


def test_usage_days_are_read_only_in_the_admin(admin_client, alice):
    record(alice, NOW, prompt=4, completion=5)
    usage_rollup(now=NOW)
    row = UsageDay.objects.get()

    changelist = admin_client.get(reverse("admin:accounts_usageday_changelist"))
    change = admin_client.get(reverse("admin:accounts_usageday_change", args=[row.pk])).content.decode()

    assert [found.pk for found in changelist.context["cl"].result_list] == [row.pk]
    assert '<td class="field-total_tokens">9</td>' in changelist.content.decode()
    assert 'name="requests"' not in change
    assert 'name="prompt_tokens"' not in change
    assert admin_client.get(reverse("admin:accounts_usageday_add")).status_code == 403
    assert admin_client.post(reverse("admin:accounts_usageday_delete", args=[row.pk])).status_code == 403
    assert (
        admin_client.post(reverse("admin:accounts_usageday_change", args=[row.pk]), {"requests": 99}).status_code == 403
    )
    row.refresh_from_db()
    assert row.requests == 1
