"""Admitting and settling requests straight through the ledger's services, for budget tests."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

from django.contrib.auth.models import User

from accounts.models import Account, ApiKey, Budget, Price, UsageRecord
from accounts.services import account_for, usage_admit, usage_finish

MODEL = "synthetic"


def roomy(user: User) -> Account:
    """The user's account with limits far beyond any budget of the tests."""
    account = account_for(user)
    Account.objects.filter(pk=account.pk).update(tokens_per_day=10**9, max_concurrent_streams=1000)
    return Account.objects.select_related("plan").get(pk=account.pk)


def admit(
    user: User, *, prompt_tokens: int = 10, max_tokens: int = 10, api_key: ApiKey | None = None, channel: str = "api"
) -> tuple[UsageRecord, int]:
    account = Account.objects.select_related("plan").get(user=user)
    record, granted, _ = usage_admit(
        user=user,
        limits=account.limits,
        requests=1,
        channel=channel,
        model=MODEL,
        stream_id=uuid.uuid4().hex,
        producer="test",
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        api_key=api_key,
    )
    return record, granted


def settle(record: UsageRecord, *, completion_tokens: int) -> UsageRecord:
    usage_finish(
        stream_id=record.stream_id,
        status=UsageRecord.Status.COMPLETE,
        finish_reason="stop",
        prompt_tokens=record.prompt_tokens,
        completion_tokens=completion_tokens,
        ttft_ms=1,
        duration_ms=1,
    )
    return UsageRecord.objects.get(pk=record.pk)


def use(user: User, tokens: int, **kwargs: object) -> UsageRecord:
    """A finished request of `tokens` tokens: half prompt, half answer."""
    record, _ = admit(user, prompt_tokens=tokens // 2, max_tokens=tokens - tokens // 2, **kwargs)  # type: ignore[arg-type]
    return settle(record, completion_tokens=tokens - tokens // 2)


def budget(**fields: object) -> Budget:
    defaults: dict[str, object] = {"period": Budget.Period.DAY, "unit": Budget.Unit.TOKENS, "soft_limit_percent": None}
    return Budget.objects.create(**{**defaults, **fields})


def price(per_million: str, *, valid_from: dt.datetime, output: str | None = None) -> Price:
    return Price.objects.create(
        model=MODEL,
        input_per_million=Decimal(per_million),
        output_per_million=Decimal(output or per_million),
        valid_from=valid_from,
    )
