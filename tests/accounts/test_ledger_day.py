"""The day's running total on the account: admission reads one row, and the total always
equals what the ledger's records of the day charge (accounts.services)."""

from __future__ import annotations

import datetime as dt
import importlib
import random
import uuid

import pytest
from django.apps import apps
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.urls import reverse
from django.utils import timezone

from accounts.models import Account, UsageRecord, charged_tokens_sum
from accounts.services import (
    QuotaExceeded,
    account_for,
    quota_for,
    usage_admit,
    usage_finish,
    usage_finish_from_cache,
    usage_withdraw,
)
from generation.backends.dispatch import QUEUE_PRODUCER
from generation.backends.reaping import generation_abandon

pytestmark = pytest.mark.django_db


def admit(user, *, prompt_tokens: int = 10, max_tokens: int = 50, producer: str = "test") -> str:
    stream_id = uuid.uuid4().hex
    usage_admit(
        user=user,
        limits=account_for(user).limits,
        requests=1,
        channel="api",
        model="synthetic",
        stream_id=stream_id,
        producer=producer,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
    )
    return stream_id


def finish(stream_id: str, *, prompt_tokens: int = 10, completion_tokens: int = 7, status: str = "complete") -> None:
    usage_finish(
        stream_id=stream_id,
        status=status,
        finish_reason="stop",
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        ttft_ms=5,
        duration_ms=9,
    )


def set_limits(user, **limits: int) -> None:
    account = account_for(user)  # the copy cached on `user`, which admit() reads
    for name, value in limits.items():
        setattr(account, name, value)
    account.save(update_fields=list(limits))


def running_total(user) -> int:
    return Account.objects.get(user=user).tokens_used_on(timezone.now().date())


def ledger_total(user) -> int:
    midnight = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    records = UsageRecord.objects.filter(user=user, created_at__gte=midnight)
    return records.aggregate(tokens=charged_tokens_sum())["tokens"] or 0


def test_admission_reserves_the_prompt_and_max_tokens_and_finishing_settles_to_what_was_generated(alice):
    stream_id = admit(alice, prompt_tokens=10, max_tokens=50)
    assert running_total(alice) == 60
    assert quota_for(alice).tokens_used_today == 60

    finish(stream_id, prompt_tokens=10, completion_tokens=7)

    assert running_total(alice) == 17 == ledger_total(alice)
    assert quota_for(alice).tokens_used_today == 17


def test_settling_twice_changes_nothing(alice):
    """A result save retried on a new connection runs usage_finish again."""
    stream_id = admit(alice)
    finish(stream_id, completion_tokens=7)
    finish(stream_id, completion_tokens=7)
    assert running_total(alice) == 17 == ledger_total(alice)


def test_a_cached_answer_charges_its_prompt_only(alice):
    stream_id = admit(alice, prompt_tokens=12, max_tokens=40)
    usage_finish_from_cache(stream_id=stream_id, finish_reason="stop", ttft_ms=1, duration_ms=1)
    assert running_total(alice) == 12 == ledger_total(alice)


def test_a_generation_that_never_started_gives_its_reservation_back(alice):
    admit(alice, prompt_tokens=3, max_tokens=5)
    stream_id = admit(alice, prompt_tokens=10, max_tokens=50)
    usage_withdraw(stream_id=stream_id)
    assert not UsageRecord.objects.filter(stream_id=stream_id).exists()
    assert running_total(alice) == 8 == ledger_total(alice)


def test_an_abandoned_queued_generation_charges_its_prompt_only(alice):
    stream_id = admit(alice, prompt_tokens=10, max_tokens=50, producer=QUEUE_PRODUCER)
    assert generation_abandon(stream_id=stream_id, message_id=None)
    assert running_total(alice) == 10 == ledger_total(alice)


def test_one_users_ledger_never_moves_anothers_total(alice, bob):
    admit(bob, prompt_tokens=100, max_tokens=100)
    finish(admit(alice), completion_tokens=7)
    assert running_total(alice) == 17
    assert running_total(bob) == 200


def test_the_budget_is_refused_from_the_running_total(alice):
    set_limits(alice, tokens_per_day=100)
    finish(admit(alice, prompt_tokens=10, max_tokens=80), completion_tokens=80)  # 90 of 100 used
    with pytest.raises(QuotaExceeded) as refused:
        admit(alice, prompt_tokens=10)
    assert refused.value.code == "insufficient_quota"


def test_a_new_day_starts_from_nothing_and_yesterdays_late_settlements_leave_it_alone(alice):
    late = admit(alice, prompt_tokens=10, max_tokens=80)
    yesterday = timezone.now() - dt.timedelta(days=1)
    UsageRecord.objects.filter(stream_id=late).update(created_at=yesterday)
    Account.objects.filter(user=alice).update(ledger_day=yesterday.date())

    admit(alice, prompt_tokens=5, max_tokens=5)  # the day's first admission: yesterday's 90 don't count
    assert running_total(alice) == 10
    finish(late, completion_tokens=80)  # admitted before midnight, settled after
    assert running_total(alice) == 10 == ledger_total(alice)


def test_deleting_records_in_the_admin_gives_their_tokens_back(admin_client, alice):
    set_limits(alice, max_concurrent_streams=3)
    kept = admit(alice, prompt_tokens=1, max_tokens=2)
    gone = [admit(alice, prompt_tokens=10, max_tokens=50) for _ in range(2)]
    admin_client.post(
        reverse("admin:accounts_usagerecord_changelist"),
        {
            "action": "delete_selected",
            "post": "yes",
            ACTION_CHECKBOX_NAME: [
                str(pk) for pk in UsageRecord.objects.filter(stream_id__in=gone).values_list("pk", flat=True)
            ],
        },
    )
    assert list(UsageRecord.objects.values_list("stream_id", flat=True)) == [kept]
    assert running_total(alice) == 3 == ledger_total(alice)


def test_the_running_total_equals_the_ledger_after_any_mix_of_admissions_and_settlements(alice, bob):
    for user in (alice, bob):
        set_limits(user, max_concurrent_streams=1000, tokens_per_day=10**7)
    chance = random.Random(7)
    streaming: list[str] = []
    for _ in range(200):
        user = chance.choice([alice, bob])
        step = chance.random()
        if step < 0.5 or not streaming:
            streaming.append(admit(user, prompt_tokens=chance.randint(0, 30), max_tokens=chance.randint(1, 60)))
            continue
        stream_id = streaming.pop(chance.randrange(len(streaming)))
        if step < 0.8:
            finish(stream_id, prompt_tokens=chance.randint(0, 30), completion_tokens=chance.randint(0, 60))
        elif step < 0.9:
            usage_finish_from_cache(stream_id=stream_id, finish_reason="stop", ttft_ms=1, duration_ms=1)
        else:
            usage_withdraw(stream_id=stream_id)
    for user in (alice, bob):
        assert running_total(user) == ledger_total(user) > 0


def test_the_upgrade_starts_each_total_from_the_days_ledger(alice, bob):
    first = admit(alice, prompt_tokens=10, max_tokens=50)
    finish(admit(alice, prompt_tokens=4, max_tokens=8), prompt_tokens=4, completion_tokens=2)
    old = admit(bob, prompt_tokens=9, max_tokens=9)
    UsageRecord.objects.filter(stream_id=old).update(created_at=timezone.now() - dt.timedelta(days=1))
    Account.objects.update(ledger_day=None, ledger_day_tokens=0)  # as before the migration

    migration = importlib.import_module("accounts.migrations.0009_account_ledger_day")
    migration.count_today(apps, None)

    assert running_total(alice) == 66 == ledger_total(alice)
    assert running_total(bob) == 0
    assert UsageRecord.objects.get(stream_id=first).status == "streaming"
