"""Admissions arriving together commit together, and every limit stays exact (accounts.group_commit)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.db import IntegrityError, connections, transaction

from accounts import services
from accounts.group_commit import GroupCommit
from accounts.models import Account, Plan, UsageRecord
from accounts.services import QuotaExceeded, account_for, usage_admit

pytestmark = pytest.mark.django_db(transaction=True)


def at_once(count: int, work: Callable[[int], Any]) -> list[Any]:
    """`work(i)` in `count` threads released together; each result or exception, in order."""
    start = threading.Barrier(count)
    outcomes: list[Any] = [None] * count

    def run(index: int) -> None:
        start.wait()
        try:
            outcomes[index] = work(index)
        except Exception as error:
            outcomes[index] = error
        finally:
            connections.close_all()  # this thread's own connection

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return outcomes


def admit(user, limits, prompt_tokens: int = 1, max_tokens: int = 10):
    return usage_admit(
        user=user,
        limits=limits,
        requests=1,
        channel="api",
        model="synthetic",
        stream_id=uuid.uuid4().hex,
        producer="test",
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
    )


def test_a_burst_of_admissions_keeps_the_stream_limit_exact_in_fewer_transactions(alice):
    Account.objects.filter(pk=account_for(alice).pk).update(max_concurrent_streams=5, tokens_per_day=10**6)
    limits = Account.objects.get(user=alice).limits
    batches_before = services.admissions.batches
    outcomes = at_once(24, lambda _: admit(alice, limits))
    admitted = [outcome for outcome in outcomes if isinstance(outcome, tuple)]
    refused = [outcome for outcome in outcomes if isinstance(outcome, QuotaExceeded)]
    assert len(admitted) == 5
    assert len(refused) == 19
    assert {error.code for error in refused} == {"too_many_concurrent_streams"}
    assert UsageRecord.objects.filter(user=alice).count() == 5
    assert services.admissions.batches - batches_before < 24


def test_a_burst_of_admissions_never_grants_more_tokens_than_the_day_has(alice):
    Account.objects.filter(pk=account_for(alice).pk).update(max_concurrent_streams=100, tokens_per_day=100)
    limits = Account.objects.get(user=alice).limits
    outcomes = at_once(16, lambda _: admit(alice, limits, prompt_tokens=4, max_tokens=20))
    granted = [outcome[1] for outcome in outcomes if isinstance(outcome, tuple)]
    reserved = sum(record.prompt_tokens + record.reserved_tokens for record in UsageRecord.objects.filter(user=alice))
    assert reserved <= 100
    assert sum(granted) + 4 * len(granted) == reserved
    assert all(isinstance(outcome, (tuple, QuotaExceeded)) for outcome in outcomes)


def test_bobs_admissions_are_not_refused_for_alices_limits(alice, bob):
    Account.objects.filter(pk=account_for(alice).pk).update(max_concurrent_streams=1)
    Account.objects.filter(pk=account_for(bob).pk).update(max_concurrent_streams=10)
    limits = {user.pk: Account.objects.get(user=user).limits for user in (alice, bob)}
    outcomes = at_once(12, lambda i: admit(*(alice, limits[alice.pk]) if i % 2 else (bob, limits[bob.pk])))
    bobs = [outcome for index, outcome in enumerate(outcomes) if index % 2 == 0]
    assert all(isinstance(outcome, tuple) for outcome in bobs)
    assert UsageRecord.objects.filter(user=alice).count() == 1


def test_a_call_that_fails_undoes_only_its_own_writes():
    group: GroupCommit[str] = GroupCommit()

    def work(index: int) -> str:
        return group.run(lambda: _plan_or_duplicate(index))

    outcomes = at_once(8, work)
    failed = [outcome for outcome in outcomes if isinstance(outcome, IntegrityError)]
    assert len(failed) == 1
    assert set(Plan.objects.filter(name__startswith="group-").values_list("name", flat=True)) == {
        f"group-{index}" for index in range(8) if index != 3
    }


def _plan_or_duplicate(index: int) -> str:
    name = f"group-{index}"
    Plan.objects.create(name=name)
    if index == 3:
        Plan.objects.create(name=name)  # the unique name refuses a second one
    return name


def test_a_caller_inside_a_transaction_writes_within_it_alone():
    group: GroupCommit[None] = GroupCommit()
    with pytest.raises(RuntimeError), transaction.atomic():
        group.run(lambda: Plan.objects.create(name="rolled-back") and None)
        raise RuntimeError("the caller's transaction rolls back")
    assert not Plan.objects.filter(name="rolled-back").exists()
    assert group.batches == 0
