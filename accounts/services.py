"""Plans, quotas, API keys and the usage ledger."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Count, F, Q, Sum
from django.db.models.functions import Greatest, TruncDate
from django.utils import timezone

from accounts import key_cache
from accounts.group_commit import GroupCommit
from accounts.models import (
    DEFAULT_PLAN,
    Account,
    ApiKey,
    CacheOutcome,
    Limits,
    Plan,
    UsageDay,
    UsageRecord,
    charged_tokens_sum,
    hash_key,
)
from accounts.rate_limit import WINDOW_S, request_log


class QuotaExceeded(Exception):
    """A limit refuses the request; `code` is the OpenAI-style error code."""

    def __init__(self, code: str, message: str, retry_after: int, *, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.param = param


class InvalidRequest(ValueError):
    """The request can never run as it is (unlike a QuotaExceeded, it won't pass later)."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


@dataclass(frozen=True)
class Quota:
    """Where a user stands against their limits right now."""

    limits: Limits
    requests_remaining: int
    tokens_used_today: int
    requests_reset_s: int  # until every request counted now has left the per-minute window
    tokens_reset_s: int

    @property
    def tokens_remaining(self) -> int:
        return max(0, self.limits.tokens_per_day - self.tokens_used_today)

    def headers(self) -> dict[str, str]:
        """OpenAI's rate-limit headers."""
        return {
            "x-ratelimit-limit-requests": str(self.limits.requests_per_minute),
            "x-ratelimit-remaining-requests": str(max(0, self.requests_remaining)),
            "x-ratelimit-limit-tokens": str(self.limits.tokens_per_day),
            "x-ratelimit-remaining-tokens": str(self.tokens_remaining),
            "x-ratelimit-reset-requests": f"{self.requests_reset_s}s",
            "x-ratelimit-reset-tokens": f"{self.tokens_reset_s}s",
        }


def account_for(user: User) -> Account:
    """The user's account, made on the default plan the first time.

    A user fetched with `select_related("account__plan")` (api_key_authenticate) brings it along.
    """
    if User.account.is_cached(user) and hasattr(user, "account"):
        return user.account
    try:
        return Account.objects.select_related("plan").get(user=user)
    except Account.DoesNotExist:
        plan, _ = Plan.objects.get_or_create(name=DEFAULT_PLAN)
        account, _ = Account.objects.select_related("plan").get_or_create(user=user, defaults={"plan": plan})
        return account


def quota_for(user: User, *, limits: Limits | None = None) -> Quota:
    limits = limits or account_for(user).limits
    now = timezone.now()
    window = request_log().look(_rate_key(user), now=now.timestamp())
    return Quota(
        limits=limits,
        requests_remaining=limits.requests_per_minute - window.count,
        tokens_used_today=_tokens_today(user, now),
        requests_reset_s=math.ceil(window.empty_in_s),
        tokens_reset_s=_seconds_to_midnight(now),
    )


def usage_request_count(*, user: User, limits: Limits, requested_max_tokens: int | None) -> int:
    """Count a generation request against the per-minute limit: the cheap checks, made first.

    The limit holds in any 60 seconds (accounts.rate_limit). Returns the requests of the
    last 60 s, this one included. Raises InvalidRequest (a max_tokens beyond the plan, not
    counted) or QuotaExceeded (rate_limit_exceeded, not counted either; Retry-After is when
    the oldest request of the window leaves it).
    """
    if requested_max_tokens is not None and requested_max_tokens > limits.max_tokens_per_request:
        raise InvalidRequest(f"max_tokens is at most {limits.max_tokens_per_request} on your plan.", param="max_tokens")
    limit = limits.requests_per_minute
    window = request_log().admit(_rate_key(user), limit=limit, now=timezone.now().timestamp())
    if not window.admitted:
        raise QuotaExceeded(
            "rate_limit_exceeded",
            f"Rate limit reached: {limit} requests per minute.",
            retry_after=max(1, math.ceil(window.free_in_s)),
        )
    return window.count


def signup_admit(*, address: str | None) -> None:
    """Count an account made from `address` (accounts.client_address): at most
    CHAT_SIGNUPS_PER_MINUTE in any 60 s, so that one client cannot mint accounts (and their
    quotas) in bulk. Raises QuotaExceeded, Retry-After when a place frees."""
    limit = settings.CHAT_SIGNUPS_PER_MINUTE
    window = request_log().admit(f"signup:{address}", limit=limit, now=timezone.now().timestamp())
    if not window.admitted:
        raise QuotaExceeded(
            "rate_limit_exceeded",
            f"Too many new accounts from your address: at most {limit} a minute.",
            retry_after=max(1, math.ceil(window.free_in_s)),
        )


# The group commit of every admission; tests and benchmarks count its batches.
admissions: GroupCommit[tuple[UsageRecord, int, Quota]] = GroupCommit()


@admissions.grouped
def usage_admit(
    *,
    user: User,
    limits: Limits,
    requests: int,
    channel: str,
    model: str,
    stream_id: str,
    producer: str,
    prompt_tokens: int,
    max_tokens: int,
    api_key: ApiKey | None = None,
    cache: str = "",
) -> tuple[UsageRecord, int, Quota]:
    """Reserve a counted request's tokens in today's budget and record it in the ledger.

    The prompt's tokens and the answer's max_tokens are reserved together (the answer's
    share capped by what is left of the budget); usage_finish settles them to the real
    figures. `cache` is the response cache's verdict ("hit", "miss", or "" where it does
    not apply). Returns the usage record, the max_tokens granted and the quota after
    admission. Raises QuotaExceeded (too_many_concurrent_streams, or insufficient_quota
    when the prompt and one token of answer don't fit in what is left today).

    Admissions arriving together are written in one transaction (accounts.group_commit):
    this body runs in a transaction that the group holds.
    """
    now = timezone.now()
    today = _ledger_date(now)
    # Lock the account row so two requests can't both take the last stream or tokens.
    account = Account.objects.select_for_update().only("ledger_day", "ledger_day_tokens").get(user=user)
    running = UsageRecord.objects.filter(user=user, status=UsageRecord.Status.STREAMING).count()
    if running >= limits.max_concurrent_streams:
        raise QuotaExceeded(
            "too_many_concurrent_streams",
            f"At most {limits.max_concurrent_streams} answers can stream at once on your plan.",
            retry_after=1,
        )
    used = account.tokens_used_on(today)
    remaining = limits.tokens_per_day - used
    if remaining <= prompt_tokens:
        spent = "used today's" if remaining <= 0 else f"{remaining} left of today's"
        raise QuotaExceeded(
            "insufficient_quota",
            f"This request's prompt is {prompt_tokens} tokens and you have {spent} {limits.tokens_per_day} tokens.",
            retry_after=_seconds_to_midnight(now),
        )
    granted = min(max_tokens, remaining - prompt_tokens)
    record = UsageRecord.objects.create(
        user=user,
        api_key=api_key,
        channel=channel,
        model=model,
        stream_id=stream_id,
        producer=producer,
        prompt_tokens=prompt_tokens,
        reserved_tokens=granted,
        cache=cache,
        created_at=now,
    )
    used += record.charged_tokens
    Account.objects.filter(pk=account.pk).update(ledger_day=today, ledger_day_tokens=used)
    quota = Quota(
        limits=limits,
        requests_remaining=limits.requests_per_minute - requests,
        tokens_used_today=used,
        requests_reset_s=int(WINDOW_S),  # this request, just counted, is the window's newest
        tokens_reset_s=_seconds_to_midnight(now),
    )
    return record, granted, quota


def usage_finish(
    *,
    stream_id: str,
    status: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    ttft_ms: int | None,
    duration_ms: int,
    usage_estimated: bool = False,
) -> None:
    """Settle a generation's record to its real figures; the day's total follows.

    May run twice (a write retried on a new connection): the second run changes nothing.
    """
    _usage_settle(
        stream_id,
        usage_estimated=usage_estimated,
        status=status,
        finish_reason=finish_reason,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        reserved_tokens=0,
        ttft_ms=ttft_ms,
        duration_ms=duration_ms,
    )


def usage_finish_from_cache(*, stream_id: str, finish_reason: str, ttft_ms: int, duration_ms: int) -> None:
    """Settle a request the response cache answered: a request, its prompt's tokens, and
    no completion tokens (nothing was generated)."""
    _usage_settle(
        stream_id,
        status=UsageRecord.Status.COMPLETE,
        finish_reason=finish_reason,
        completion_tokens=0,
        reserved_tokens=0,
        ttft_ms=ttft_ms,
        duration_ms=duration_ms,
    )


def usage_withdraw(*, stream_id: str) -> None:
    """Undo the admission of a generation that never started: its record goes, and what
    it reserved returns to the day's budget."""
    with transaction.atomic():
        record = _record_locked(stream_id)
        if record is not None:
            record.delete()
            _ledger_day_add(record, -record.charged_tokens)


def usage_recount(*, user_ids: list[int], now: dt.datetime | None = None) -> None:
    """Rebuild these users' running day totals from the ledger (after records were deleted)."""
    today = _ledger_date(now or timezone.now())
    midnight = dt.datetime.combine(today, dt.time(), tzinfo=dt.UTC)
    with transaction.atomic():
        # Locked first, so that no admission or settlement changes the ledger under the sum.
        accounts = list(Account.objects.select_for_update().filter(user_id__in=user_ids))
        totals = dict(
            UsageRecord.objects.filter(user_id__in=user_ids, created_at__gte=midnight)
            .order_by()
            .values("user")
            .annotate(tokens=charged_tokens_sum())
            .values_list("user", "tokens")
        )
        for account in accounts:
            account.ledger_day, account.ledger_day_tokens = today, totals.get(account.user_id) or 0
        Account.objects.bulk_update(accounts, ["ledger_day", "ledger_day_tokens"])


def _usage_settle(stream_id: str, **fields: object) -> None:
    with transaction.atomic():
        record = _record_locked(stream_id)
        if record is None:
            return
        charged_before = record.charged_tokens
        for name, value in fields.items():
            setattr(record, name, value)
        record.save(update_fields=list(fields))
        _ledger_day_add(record, record.charged_tokens - charged_before)


def _record_locked(stream_id: str) -> UsageRecord | None:
    """The record with what its charge and its day need (a whole record costs a third more)."""
    records = UsageRecord.objects.select_for_update().only(
        "user", "created_at", "status", "prompt_tokens", "reserved_tokens", "completion_tokens"
    )
    try:
        return records.get(stream_id=stream_id)
    except UsageRecord.DoesNotExist:
        return None


def _ledger_day_add(record: UsageRecord, tokens: int) -> None:
    """Change the running total of the record's day by `tokens`; a day since replaced
    (a record admitted before midnight, settled after) is gone and left alone."""
    if tokens:
        Account.objects.filter(user_id=record.user_id, ledger_day=_ledger_date(record.created_at)).update(
            ledger_day_tokens=Greatest(F("ledger_day_tokens") + tokens, 0)
        )


def usage_rollup(*, days: int = 2, now: dt.datetime | None = None) -> int:
    """Recompute the UsageDay totals of the last `days` UTC days, today included, from the ledger.

    Idempotent: each (day, user, model, channel) row is upserted from a fresh aggregate of
    its records, and rows in the window whose records are gone are deleted; days outside the
    window are left alone. A record still streaming counts as a request with its prompt tokens
    and no completion tokens (only finished tokens are rolled up); a later rollup adds them
    once it has finished. Returns the number of rows written.
    """
    if days < 1:
        raise ValueError(f"days must be at least 1, not {days}")
    today = (now or timezone.now()).astimezone(dt.UTC).date()
    first_day = today - dt.timedelta(days=days - 1)
    start = dt.datetime.combine(first_day, dt.time(), tzinfo=dt.UTC)
    end = dt.datetime.combine(today + dt.timedelta(days=1), dt.time(), tzinfo=dt.UTC)
    totals = (
        UsageRecord.objects.filter(created_at__gte=start, created_at__lt=end)
        .annotate(day=TruncDate("created_at", tzinfo=dt.UTC))
        .values("day", "user", "model", "channel")
        .annotate(
            request_count=Count("pk"),
            prompt=Sum("prompt_tokens"),
            completion=Sum("completion_tokens", filter=~Q(status=UsageRecord.Status.STREAMING)),
            hits=Count("pk", filter=Q(cache=CacheOutcome.HIT)),
            misses=Count("pk", filter=Q(cache=CacheOutcome.MISS)),
        )
        .order_by("day", "user", "model", "channel")
    )
    rows = [
        UsageDay(
            day=total["day"],
            user_id=total["user"],
            model=total["model"],
            channel=total["channel"],
            requests=total["request_count"],
            prompt_tokens=total["prompt"] or 0,
            completion_tokens=total["completion"] or 0,
            cache_hits=total["hits"],
            cache_misses=total["misses"],
        )
        for total in totals
    ]
    keys = {(row.day, row.user_id, row.model, row.channel) for row in rows}
    with transaction.atomic():
        in_window = UsageDay.objects.filter(day__gte=first_day, day__lte=today)
        stale = [
            pk
            for pk, *key in in_window.values_list("pk", "day", "user_id", "model", "channel")
            if tuple(key) not in keys
        ]
        UsageDay.objects.filter(pk__in=stale).delete()
        UsageDay.objects.bulk_create(
            rows,
            update_conflicts=True,
            unique_fields=["day", "user", "model", "channel"],
            update_fields=[
                "requests",
                "prompt_tokens",
                "completion_tokens",
                "cache_hits",
                "cache_misses",
                "updated_at",
            ],
        )
    return len(rows)


def api_key_create(*, user: User, name: str) -> tuple[ApiKey, str]:
    """Make a key; the plain key is returned this once and never stored."""
    plain = ApiKey.generate()
    key = ApiKey.objects.create(user=user, name=name, prefix=plain[:10], hashed=hash_key(plain))
    return key, plain


def api_key_revoke(*, key: ApiKey) -> None:
    """Revoke a key: refused from the very next request on, by every process."""
    key.revoke()
    key_cache.api_access_changed()


def api_key_authenticate(plain: str) -> ApiKey | None:
    """The active key matching `plain`, with its user and their account; marks it used.

    A key seen before comes from this process's memory while the access version is
    unchanged (accounts.key_cache): a revocation is refused on the very next request.
    """
    hashed = hash_key(plain)
    version = key_cache.access_version()
    key = key_cache.remembered_key(hashed, version)
    if key is None:
        keys = ApiKey.objects.select_related("user__account__plan")
        key = keys.filter(hashed=hashed, revoked_at__isnull=True).first()
        if key is None or not key.user.is_active:
            return None
        key_cache.remember_key(hashed, version, key)
    if not key.matches(plain):
        return None
    now = timezone.now()
    # Write last-used at most once a minute: a hot key would otherwise write every request.
    if key.last_used_at is None or now - key.last_used_at > dt.timedelta(minutes=1):
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
    return key


def _rate_key(user: User) -> str:
    return f"ratelimit:{user.pk}"


def _tokens_today(user: User, now: dt.datetime) -> int:
    # Read afresh: the user's account may be a copy remembered with their key.
    account = Account.objects.only("ledger_day", "ledger_day_tokens").filter(user=user).first()
    return account.tokens_used_on(_ledger_date(now)) if account else 0


def _ledger_date(moment: dt.datetime) -> dt.date:
    """The day a moment counts against: days begin at midnight UTC, as the quota resets."""
    return moment.astimezone(dt.UTC).date()


def _seconds_to_midnight(now: dt.datetime) -> int:
    tomorrow = (now + dt.timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return int((tomorrow - now).total_seconds())
