"""Plans, quotas, API keys and the usage ledger."""

from __future__ import annotations

import datetime as dt
import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal
from functools import wraps
from typing import Any, ParamSpec, TypeVar

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.db import transaction
from django.db.models import Count, F, Max, Q, QuerySet, Sum
from django.db.models.functions import Coalesce, Greatest, TruncDate
from django.http import HttpRequest
from django.utils import timezone

from accounts import key_cache
from accounts.alerts import alert_record, alerts_for
from accounts.budgets import BudgetSpent, BudgetStanding, budget_admit, budget_standings, team_of
from accounts.group_commit import GroupCommit
from accounts.models import (
    DEFAULT_PLAN,
    GUEST_PLAN,
    GUEST_PLAN_LIMITS,
    Account,
    ApiKey,
    Budget,
    BudgetAlert,
    CacheOutcome,
    Limits,
    Plan,
    Team,
    UsageDay,
    UsageRecord,
    charged_tokens_sum,
    hash_key,
)
from accounts.prices import cost_of, price_at, spend_of
from accounts.rate_limit import WINDOW_S, request_log
from audit.models import AuditRecord
from audit.services import audit_record, target_of
from infrastructure.metrics import observe_spend

P = ParamSpec("P")
T = TypeVar("T")


class QuotaExceeded(Exception):
    """A limit refuses the request; `code` is the OpenAI-style error code. `spent`: the
    budget that refused it (accounts.budgets), which earns its period an alert."""

    def __init__(
        self,
        code: str,
        message: str,
        retry_after: int,
        *,
        param: str | None = None,
        spent: BudgetStanding | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.param = param
        self.spent = spent


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

    def tighter(self, other: Quota | None) -> Quota:
        """Per limit (requests, tokens), the one of the two with less left: what the
        x-ratelimit headers report for a key with limits of its own."""
        if other is None:
            return self
        requests = self if self.requests_remaining <= other.requests_remaining else other
        tokens = self if self.tokens_remaining <= other.tokens_remaining else other
        limits = replace(
            self.limits,
            requests_per_minute=requests.limits.requests_per_minute,
            tokens_per_day=tokens.limits.tokens_per_day,
            max_concurrent_streams=min(self.limits.max_concurrent_streams, other.limits.max_concurrent_streams),
        )
        return Quota(
            limits=limits,
            requests_remaining=requests.requests_remaining,
            tokens_used_today=tokens.tokens_used_today,
            requests_reset_s=requests.requests_reset_s,
            tokens_reset_s=tokens.tokens_reset_s,
        )

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


def quota_for(user: User, *, limits: Limits | None = None, api_key: ApiKey | None = None) -> Quota:
    """Where the user stands; through `api_key`, the tighter of it and its own limits."""
    limits = limits or account_for(user).limits
    now = timezone.now()
    window = request_log().look(_rate_key(user, limits), now=now.timestamp())
    quota = Quota(
        limits=limits,
        requests_remaining=limits.requests_per_minute - window.count,
        tokens_used_today=_tokens_today(user, limits, now),
        requests_reset_s=math.ceil(window.empty_in_s),
        tokens_reset_s=_seconds_to_midnight(now),
    )
    if api_key is None or not api_key.has_limits:
        return quota
    key_limits = key_limits_within(api_key, limits)
    key_window = request_log().look(_key_rate_key(api_key), now=now.timestamp())
    key_quota = Quota(
        limits=key_limits,
        requests_remaining=key_limits.requests_per_minute - key_window.count,
        tokens_used_today=_key_tokens_today(api_key, now),
        requests_reset_s=math.ceil(key_window.empty_in_s),
        tokens_reset_s=_seconds_to_midnight(now),
    )
    return quota.tighter(key_quota)


def quota_reported(user: User, *, api_key: ApiKey | None = None) -> Quota:
    """What the x-ratelimit headers report: quota_for's, its tokens those of a budget in
    tokens where that has less left (within_budgets). The day's own figures (the chat's
    meter, /v1/usage's `tokens`) stay quota_for's."""
    now = timezone.now()
    standings = budget_standings(account=account_for(user), api_key=api_key, now=now)
    return within_budgets(quota_for(user, api_key=api_key), standings, now)


def within_budgets(quota: Quota, standings: list[BudgetStanding], now: dt.datetime) -> Quota:
    """`quota` with its tokens those of the budget in tokens with the least left, where that
    is less than the quota's own: what the x-ratelimit-*-tokens headers report. (A budget
    in money has no count of tokens: /v1/usage reports it.)"""
    for standing in standings:
        if standing.budget.unit != Budget.Unit.TOKENS:
            continue
        resets_at = standing.window.resets_at or now
        as_quota = replace(
            quota,
            limits=replace(quota.limits, tokens_per_day=int(standing.budget.amount)),
            tokens_used_today=int(standing.used),
            tokens_reset_s=max(0, math.ceil((resets_at - now).total_seconds())),
        )
        if as_quota.tokens_remaining < quota.tokens_remaining:
            quota = as_quota
    return quota


def key_limits_within(api_key: ApiKey, limits: Limits) -> Limits:
    """The key's limits: its own where it has one, each capped by its owner's."""

    def pick(field: str) -> int:
        own = getattr(api_key, field)
        return int(getattr(limits, field) if own is None else min(own, getattr(limits, field)))

    return replace(
        limits,
        requests_per_minute=pick("requests_per_minute"),
        tokens_per_day=pick("tokens_per_day"),
        max_concurrent_streams=pick("max_concurrent_streams"),
    )


def usage_request_count(
    *, user: User, limits: Limits, requested_max_tokens: int | None, api_key: ApiKey | None = None
) -> int:
    """Count a generation request against the per-minute limit: the cheap checks, made first.

    The limit holds in any 60 seconds (accounts.rate_limit). Returns the requests of the
    last 60 s, this one included. Raises InvalidRequest (a max_tokens beyond the plan, not
    counted) or QuotaExceeded (rate_limit_exceeded, not counted either; Retry-After is when
    the oldest request of the window leaves it).

    A key with a per-minute limit of its own is counted first, against its own window: a
    request it refuses is not counted against the owner's minute (one the owner's limit
    refuses still counts against the key's).
    """
    if requested_max_tokens is not None and requested_max_tokens > limits.max_tokens_per_request:
        raise InvalidRequest(f"max_tokens is at most {limits.max_tokens_per_request} on your plan.", param="max_tokens")
    if api_key is not None and api_key.requests_per_minute is not None:
        key_limit = min(api_key.requests_per_minute, limits.requests_per_minute)
        _minute_admit(
            _key_rate_key(api_key), key_limit, f"Rate limit reached: this key's {key_limit} requests per minute."
        )
    limit = limits.requests_per_minute
    count = _minute_admit(_rate_key(user, limits), limit, f"Rate limit reached: {limit} requests per minute.")
    _team_request_count(user, api_key)
    return count


def _team_request_count(user: User, api_key: ApiKey | None) -> None:
    """Count a request against its team's per-minute limit, if it has one (after its user's)."""
    team_id = team_of(account_for(user), api_key)
    if team_id is None:
        return
    limit = Team.objects.filter(pk=team_id).values_list("requests_per_minute", flat=True).first()
    if limit is None:
        return
    _minute_admit(f"ratelimit:team:{team_id}", limit, f"Rate limit reached: your team's {limit} requests per minute.")


def _minute_admit(key: str, limit: int, refusal: str) -> int:
    """Count one event in `key`'s window of 60 s (accounts.rate_limit); the events of the
    window, this one included. QuotaExceeded (rate_limit_exceeded, saying `refusal`, not
    counted; Retry-After when the oldest event leaves the window) when it holds `limit`."""
    window = request_log().admit(key, limit=limit, now=timezone.now().timestamp())
    if not window.admitted:
        raise QuotaExceeded("rate_limit_exceeded", refusal, retry_after=max(1, math.ceil(window.free_in_s)))
    return window.count


def signup_admit(*, address: str | None) -> None:
    """Count an account made from `address` (accounts.client_address): at most
    CHAT_SIGNUPS_PER_MINUTE in any 60 s, so that one client cannot mint accounts (and their
    quotas) in bulk. Raises QuotaExceeded, Retry-After when a place frees."""
    limit = settings.CHAT_SIGNUPS_PER_MINUTE
    _minute_admit(f"signup:{address}", limit, f"Too many new accounts from your address: at most {limit} a minute.")


def password_reset_admit(*, address: str | None) -> None:
    """Count a password-reset e-mail asked for from `address`: at most
    PASSWORD_RESETS_PER_MINUTE in any 60 s, so that the form cannot flood a mailbox (nor
    the mail server). Raises QuotaExceeded, Retry-After when a place frees."""
    limit = settings.PASSWORD_RESETS_PER_MINUTE
    _minute_admit(
        f"password-reset:{address}",
        limit,
        f"Too many password resets asked for from your address: at most {limit} a minute.",
    )


def signup_open() -> bool:
    """Sign-up makes password accounts: none while CHAT_SIGNUP is closed or password log-ins are off."""
    return settings.CHAT_SIGNUP != "closed" and settings.CHAT_PASSWORD_LOGIN


def guest_keep_invitation() -> str:
    """What a guest is invited to do to keep the chat (accounts:guest_keep): sign up where
    sign-up makes accounts, else log in to one (accounts.guests moves the chat there)."""
    return "Sign up to keep this chat" if signup_open() else "Log in to keep this chat"


def guest_plan() -> Plan:
    """The guests' plan, made by migration 0010 (and here again, should it have gone)."""
    plan, _ = Plan.objects.get_or_create(name=GUEST_PLAN, defaults=GUEST_PLAN_LIMITS)
    return plan


def guest_create(*, address: str) -> User:
    """Make a guest (CHAT_GUEST) for a client at `address`: a user without a password, kept
    by its session alone, on the guest plan.

    Counted against the same per-address limit as sign-ups (signup_admit, which raises
    QuotaExceeded). A new cookie makes a new guest, but not new limits: every guest of one
    address shares the guest plan's limits (Limits.guest_address, usage_admit). Reusing one
    guest per address instead would show one visitor's chat to another behind the same
    address (an office, a school); sharing limits between separate guests shows nothing.
    """
    signup_admit(address=address)
    with transaction.atomic():
        user = User.objects.create_user(f"guest-{secrets.token_hex(6)}")  # no password: unusable
        Account.objects.create(user=user, plan=guest_plan(), is_guest=True, guest_address=address)
    return user


def user_is_guest(user: User | AnonymousUser) -> bool:
    return user.is_authenticated and Account.objects.filter(user_id=user.pk, is_guest=True).exists()


def guest_convert(*, user: User, username: str, password: str, active: bool = True) -> None:
    """Turn a guest into an account of its own: a name, a password, the default plan.

    The same user, so its conversations stay. An inactive one (CHAT_SIGNUP=approval) waits
    for an admin's approval like any new account.
    """
    default, _ = Plan.objects.get_or_create(name=DEFAULT_PLAN)
    with transaction.atomic():
        user.username = username
        user.set_password(password)
        user.is_active = active
        user.save(update_fields=["username", "password", "is_active"])
        Account.objects.filter(user=user).update(is_guest=False, guest_address=None, plan=default)
    # A key remembered with the guest's account (an admin may have made one) is read afresh.
    key_cache.api_access_changed()


def guest_adopt(*, guest_id: int, user: User, request: HttpRequest | None = None) -> int:
    """Move a guest's conversations into `user`'s account as they log in to it, then delete
    the guest; how many moved. Nothing when `guest_id` is not a guest (or is `user`).

    The log-in must not fail here, so the account's max_conversations is not checked: a
    conversation over the limit still moves, and the plan refuses new ones until one is
    deleted (conversation_admit), as after an admin lowers a limit. The guest's usage goes
    with it, as in guest_purge: its tokens were the guest plan's, not the account's.
    """
    if user.pk == guest_id or user_is_guest(user):
        return 0
    with transaction.atomic():
        guest = User.objects.select_for_update().filter(pk=guest_id, account__is_guest=True).first()
        if guest is None:  # not a guest, or adopted already by a log-in racing this one
            return 0
        # Through the user's reverse relations: accounts sits below the chat and documents apps.
        # A conversation takes its messages, feedback, share link and tools with it.
        moved = guest.conversations.update(user=user)
        guest.documents.update(user=user)
        target = target_of(guest, guest.username)
        changes = {"owner": (guest.username, user.get_username())}
        guest.delete()
        audit_record(
            action=AuditRecord.Action.GUEST_ADOPTED, actor=user, target=target, changes=changes, request=request
        )
    return moved


def guest_purge(*, now: dt.datetime | None = None) -> int:
    """Delete the guests idle for CHAT_GUEST_TTL_DAYS, with their conversations and usage.

    Idle: no log-in and no generation (a usage record) since; returns how many went.
    """
    cutoff = (now or timezone.now()) - dt.timedelta(days=settings.CHAT_GUEST_TTL_DAYS)
    last_seen = Greatest(
        Coalesce("last_login", "date_joined"), Coalesce(Max("usage_records__created_at"), "date_joined")
    )
    idle = (
        User.objects.filter(account__is_guest=True)
        .annotate(last_seen=last_seen)
        .filter(last_seen__lt=cutoff)
        .values_list("pk", flat=True)
    )
    ids = list(idle)
    for start in range(0, len(ids), 500):  # a bounded statement each, whatever the backlog
        User.objects.filter(pk__in=ids[start : start + 500]).delete()
    return len(ids)


def conversation_admit(*, user: User, kept: int) -> None:
    """Refuse a new conversation to a user who keeps `kept`, their plan's max_conversations
    already (a guest's one): InvalidRequest, since waiting won't help."""
    account = account_for(user)
    limit = account.plan.max_conversations
    if limit is None or kept < limit:
        return
    words = "one conversation" if limit == 1 else f"{limit} conversations"
    advice = f"{guest_keep_invitation()} and start more." if account.is_guest else "Delete one to start another."
    raise InvalidRequest(f"Your plan keeps {words} at most. {advice}", code="conversation_limit_reached")


# The group commit of every admission; tests and benchmarks count its batches.
admissions: GroupCommit[tuple[UsageRecord, int, Quota]] = GroupCommit()


def _alerting_spent(admit: Callable[P, T]) -> Callable[P, T]:
    """`admit`, recording the alert a budget earns when it refuses a request: outside the
    admission's savepoint, which the refusal undoes."""

    @wraps(admit)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return admit(*args, **kwargs)
        except QuotaExceeded as refusal:
            if refusal.spent is not None:
                with transaction.atomic():
                    alert_record(standing=refusal.spent, kind=BudgetAlert.Kind.EXHAUSTED)
            raise

    return call


@_alerting_spent
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
    admission, as the x-ratelimit headers report it (quota_reported). Raises QuotaExceeded
    (too_many_concurrent_streams, or insufficient_quota when the prompt and one token of
    answer don't fit in what is left today, or in a budget that applies: accounts.budgets,
    whose soft limits crossed here earn alerts).

    Admissions arriving together are written in one transaction (accounts.group_commit):
    this body runs in a transaction that the group holds.

    A guest's limits are those of every guest of its address together (Limits.guest_address):
    their streams and their day's tokens are counted as one. Their accounts that took tokens
    today are locked with the guest's own; two of an address's guests admitted at the same
    moment on PostgreSQL, neither having asked anything yet today, may each see the other's
    tokens missing, an overshoot of one request each, which the shared per-minute limit bounds.
    """
    now = timezone.now()
    today = _ledger_date(now)
    # Lock the account rows so two requests can't both take the last stream or tokens.
    sharing = list(
        _ledger_sharers(user, limits, today)
        .select_for_update()
        .order_by("pk")
        .only("user", "plan", "team", "ledger_day", "ledger_day_tokens")
    )
    account = next(each for each in sharing if each.user_id == user.pk)
    running = UsageRecord.objects.filter(
        user__in=[each.user_id for each in sharing], status=UsageRecord.Status.STREAMING
    ).count()
    if running >= limits.max_concurrent_streams:
        raise QuotaExceeded(
            "too_many_concurrent_streams",
            f"At most {limits.max_concurrent_streams} answers can stream at once on your plan.",
            retry_after=1,
        )
    own = account.tokens_used_on(today)
    used = sum(each.tokens_used_on(today) for each in sharing)
    remaining = limits.tokens_per_day - used
    if remaining <= prompt_tokens:
        spent = "used today's" if remaining <= 0 else f"{remaining} left of today's"
        raise QuotaExceeded(
            "insufficient_quota",
            f"This request's prompt is {prompt_tokens} tokens and you have {spent} {limits.tokens_per_day} tokens.",
            retry_after=_seconds_to_midnight(now),
        )
    granted = min(max_tokens, remaining - prompt_tokens)
    key_quota = None
    if api_key is not None and api_key.has_limits:  # the account's lock serialises its keys too
        key_quota, granted = _key_admit(api_key, limits, requests, prompt_tokens, granted, now)
    team_id = team_of(account, api_key)
    if team_id is not None:
        _team_admit(team_id)
    try:
        budgets = budget_admit(
            account=account,
            api_key=api_key,
            team_id=team_id,
            model=model,
            prompt_tokens=prompt_tokens,
            granted=granted,
            now=now,
        )
    except BudgetSpent as spent:
        raise QuotaExceeded("insufficient_quota", spent.message, spent.retry_after, spent=spent.standing) from None
    granted = budgets.granted
    record = UsageRecord.objects.create(
        user=user,
        api_key=api_key,
        team_id=team_id,
        channel=channel,
        model=model,
        stream_id=stream_id,
        producer=producer,
        prompt_tokens=prompt_tokens,
        reserved_tokens=granted,
        reserved_cost=budgets.reserved_cost,
        cost_currency=budgets.cost_currency,
        cache=cache,
        created_at=now,
    )
    alerts_for(budgets.standings)
    used += record.charged_tokens
    Account.objects.filter(pk=account.pk).update(ledger_day=today, ledger_day_tokens=own + record.charged_tokens)
    quota = Quota(
        limits=limits,
        requests_remaining=limits.requests_per_minute - requests,
        tokens_used_today=used,
        requests_reset_s=int(WINDOW_S),  # this request, just counted, is the window's newest
        tokens_reset_s=_seconds_to_midnight(now),
    )
    if key_quota is not None:
        key_quota = replace(key_quota, tokens_used_today=key_quota.tokens_used_today + record.charged_tokens)
    return record, granted, within_budgets(quota.tighter(key_quota), budgets.standings, now)


def _team_admit(team_id: int) -> None:
    """Lock the team's row, after the account's (always in this order): its members' and
    keys' admissions take turns through it, for its streams and its budgets alike."""
    team = Team.objects.select_for_update().only("max_concurrent_streams").get(pk=team_id)
    if team.max_concurrent_streams is None:
        return
    running = UsageRecord.objects.filter(team_id=team_id, status=UsageRecord.Status.STREAMING).count()
    if running >= team.max_concurrent_streams:
        raise QuotaExceeded(
            "too_many_concurrent_streams",
            f"At most {team.max_concurrent_streams} answers can stream at once in your team.",
            retry_after=1,
        )


def _key_admit(
    api_key: ApiKey, limits: Limits, requests: int, prompt_tokens: int, granted: int, now: dt.datetime
) -> tuple[Quota, int]:
    """Check a request against its key's own streams and day's tokens (under its owner's
    row lock); the key's quota before this request's tokens, and the tokens granted."""
    key_limits = key_limits_within(api_key, limits)
    running = UsageRecord.objects.filter(api_key=api_key, status=UsageRecord.Status.STREAMING).count()
    if running >= key_limits.max_concurrent_streams:
        raise QuotaExceeded(
            "too_many_concurrent_streams",
            f"At most {key_limits.max_concurrent_streams} answers can stream at once with this key.",
            retry_after=1,
        )
    used = _key_tokens_today(api_key, now)
    remaining = key_limits.tokens_per_day - used
    if remaining <= prompt_tokens:
        spent = "used its day's" if remaining <= 0 else f"{remaining} left of its day's"
        raise QuotaExceeded(
            "insufficient_quota",
            f"This request's prompt is {prompt_tokens} tokens and this key has {spent} "
            f"{key_limits.tokens_per_day} tokens.",
            retry_after=_seconds_to_midnight(now),
        )
    window = request_log().look(_key_rate_key(api_key), now=now.timestamp())
    quota = Quota(
        limits=key_limits,
        requests_remaining=key_limits.requests_per_minute - (window.count if api_key.requests_per_minute else requests),
        tokens_used_today=used,
        requests_reset_s=int(WINDOW_S),
        tokens_reset_s=_seconds_to_midnight(now),
    )
    return quota, min(granted, remaining - prompt_tokens)


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
    tool_calls: int = 0,
) -> None:
    """Settle a generation's record to its real figures (its tool calls among them); the
    day's total follows.

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
        tool_calls=tool_calls,
    )


def usage_finish_from_cache(
    *, stream_id: str, finish_reason: str, ttft_ms: int, duration_ms: int, answer_tokens: int = 0
) -> None:
    """Settle a request the response cache answered: a request, its prompt's tokens, and
    no completion tokens (nothing was generated). Its cost is a cache hit's at the model's
    price (accounts.prices.cost_of), the cached answer's `answer_tokens` its output."""
    _usage_settle(
        stream_id,
        cached_answer_tokens=answer_tokens,
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


def _usage_settle(stream_id: str, *, cached_answer_tokens: int | None = None, **fields: object) -> None:
    """Save a record's final figures, and its cost at the price valid when it was admitted."""
    with transaction.atomic():
        record = _record_locked(stream_id)
        if record is None:
            return
        charged_before = record.charged_tokens
        cost_before = record.cost if record.cost is not None else Decimal(0)
        for name, value in fields.items():
            setattr(record, name, value)
        price = price_at(record.model, record.created_at)
        if price is not None:
            record.cost = cost_of(
                price,
                prompt_tokens=record.prompt_tokens,
                completion_tokens=record.completion_tokens if cached_answer_tokens is None else cached_answer_tokens,
                cached=cached_answer_tokens is not None,
            )
            record.cost_currency = price.currency
            fields = {**fields, "cost": record.cost, "cost_currency": record.cost_currency}
        record.save(update_fields=list(fields))
        _ledger_day_add(record, record.charged_tokens - charged_before)
        if record.cost is not None and record.cost > cost_before:  # a settlement run twice counts once
            _spend_count(record, record.cost - cost_before)


def _spend_count(record: UsageRecord, amount: Decimal) -> None:
    """Add a settled record's cost to the spend metric once its transaction commits."""
    plan = Account.objects.filter(user_id=record.user_id).values_list("plan__name", flat=True).first() or ""
    model, currency = record.model, record.cost_currency
    transaction.on_commit(lambda: observe_spend(model=model, plan=plan, currency=currency, amount=amount))


def usage_spend_today(*, user: User, now: dt.datetime | None = None) -> dict[str, Decimal]:
    """The user's spend on today's (UTC) settled records, by currency."""
    return spend_of(_records_today(user, now))


def usage_tool_calls_today(*, user: User, now: dt.datetime | None = None) -> int:
    """How many tools the user's answers called today (UTC): tool calls cost what their
    rounds' tokens cost, and a team watching its spend wants to see them apart."""
    return _records_today(user, now).aggregate(calls=Coalesce(Sum("tool_calls"), 0))["calls"]


def _records_today(user: User, now: dt.datetime | None) -> QuerySet[UsageRecord]:
    midnight = dt.datetime.combine(_ledger_date(now or timezone.now()), dt.time(), tzinfo=dt.UTC)
    return UsageRecord.objects.filter(user=user, created_at__gte=midnight)


@dataclass(frozen=True)
class BudgetReport:
    """The budgets that apply to a caller, as /v1/usage shows them."""

    team: str | None
    budgets: list[dict[str, object]]


def usage_budgets(*, account: Account, api_key: ApiKey | None = None, now: dt.datetime | None = None) -> BudgetReport:
    """Where every budget that applies to the account's requests through `api_key` stands,
    the one with the least share left first; and the team they count against."""
    standings = budget_standings(account=account, api_key=api_key, now=now or timezone.now())
    standings.sort(key=lambda each: each.remaining / each.budget.amount if each.budget.amount else Decimal(0))
    team_id = team_of(account, api_key)
    team = None if team_id is None else Team.objects.filter(pk=team_id).values_list("name", flat=True).first()
    return BudgetReport(team, [standing.report() for standing in standings])


def team_spend(*, team: Team, start: dt.datetime) -> tuple[int, dict[str, Decimal]]:
    """A team's charged tokens and spend (by currency) since `start`: its members' and keys'."""
    records = UsageRecord.objects.filter(team=team, created_at__gte=start)
    tokens = records.aggregate(tokens=charged_tokens_sum())["tokens"] or 0
    return int(tokens), spend_of(records)


def _record_locked(stream_id: str) -> UsageRecord | None:
    """The record with what its charge, its day and its cost need (a whole record costs a third more)."""
    records = UsageRecord.objects.select_for_update().only(
        "user",
        "created_at",
        "status",
        "prompt_tokens",
        "reserved_tokens",
        "completion_tokens",
        "model",
        "cost",
        "cost_currency",
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


def api_key_create(
    *,
    user: User,
    name: str,
    expires_at: dt.datetime | None = None,
    request: HttpRequest | None = None,
    **limits: int | None,
) -> tuple[ApiKey, str]:
    """Make a key, with limits of its own if given (KEY_LIMIT_FIELDS); the plain key is
    returned this once and never stored."""
    plain = ApiKey.generate()
    key = ApiKey.objects.create(
        user=user, name=name, prefix=plain[:10], hashed=hash_key(plain), expires_at=expires_at, **limits
    )
    audit_record(action=AuditRecord.Action.KEY_CREATED, actor=user, target=api_key_target(key), request=request)
    return key, plain


def api_key_revoke(*, key: ApiKey, request: HttpRequest | None = None) -> None:
    """Revoke a key: refused from the very next request on, by every process."""
    was_active = key.active
    key.revoke()
    key_cache.api_access_changed()
    if was_active:
        audit_record(action=AuditRecord.Action.KEY_REVOKED, target=api_key_target(key), request=request)


def api_key_budget_set(
    *, key: ApiKey, period: str = "", unit: str = "", amount: Decimal | None, currency: str = "USD"
) -> Budget | None:
    """Give the key its one budget of its own, in place of any it had; `amount` None: none.

    The caller checked it against its owner's (accounts.forms.KeyBudgetForm, key_budget_cap).
    """
    with transaction.atomic():
        Budget.objects.filter(api_key=key).delete()
        if amount is None:
            return None
        return Budget.objects.create(api_key=key, period=period, unit=unit, amount=amount, currency=currency)


def api_key_settings_change(
    *, user: User, key_id: int, fields: dict[str, Any], budget: dict[str, Any], request: HttpRequest | None = None
) -> bool:
    """Save what changed of a key's settings (its KEY_LIMIT_FIELDS, expiry, allowed models)
    and its budget, under the key's row lock: one audit record of {field: [before, after]},
    and every process reads its keys afresh (accounts.key_cache), as after a revocation.
    The caller checked them against the owner's (accounts.forms). Whether anything changed;
    ApiKey.DoesNotExist for a key not the user's or revoked."""
    with transaction.atomic():
        key = ApiKey.objects.select_for_update().get(pk=key_id, user=user, revoked_at__isnull=True)
        changes: dict[str, tuple[Any, Any]] = {
            name: (getattr(key, name), value) for name, value in fields.items() if getattr(key, name) != value
        }
        for name, (_, value) in changes.items():
            setattr(key, name, value)
        if changes:
            key.save(update_fields=list(changes))
        old = key.budgets.first()
        if not _same_budget(old, budget):
            new = api_key_budget_set(key=key, **budget)
            changes["budget"] = (_budget_shown(old), _budget_shown(new))
        if not changes:
            return False
        audit_record(
            action=AuditRecord.Action.KEY_CHANGED, target=api_key_target(key), changes=changes, request=request
        )
        key_cache.api_access_changed()  # now, and again once this commits
    return True


def _same_budget(old: Budget | None, new: dict[str, Any]) -> bool:
    """Whether the form's budget is the key's as it is (a budget in tokens has no currency)."""
    if old is None or new["amount"] is None:
        return old is None and new["amount"] is None
    same = (old.period, old.unit, old.amount) == (new["period"], new["unit"], new["amount"])
    return same and (old.unit == Budget.Unit.TOKENS or old.currency == new["currency"])


def _budget_shown(budget: Budget | None) -> str | None:
    return budget.amount_shown if budget is not None else None


def api_key_target(key: ApiKey) -> str:
    """A key as the audit trail names it: by id and display prefix, never more of the key."""
    return target_of(key, f"{key.prefix}…")


def api_key_authenticate(plain: str, *, request: HttpRequest | None = None) -> ApiKey | None:
    """The active key matching `plain`, with its user and their account; marks it used.

    A key seen before comes from this process's memory while the access version is
    unchanged (accounts.key_cache): a revocation is refused on the very next request.
    A revoked key is never remembered: each attempt with one reaches the database and is
    recorded in the audit trail.
    """
    hashed = hash_key(plain)
    version = key_cache.access_version()
    key = key_cache.remembered_key(hashed, version)
    if key is None:
        keys = ApiKey.objects.select_related("user__account__plan")
        key = keys.filter(hashed=hashed).first()  # revoked too, to record the attempt: one query still
        if key is None:
            return None
        if key.revoked_at is not None:
            target = api_key_target(key)
            audit_record(action=AuditRecord.Action.REVOKED_KEY_USED, target=target, request=request)
            return None
        if not key.user.is_active or _is_guest_key(key):
            return None
        key_cache.remember_key(hashed, version, key)
    if not key.matches(plain):
        return None
    now = timezone.now()
    if key.expired(now):  # read from the key itself, remembered or not: refused in every process at once
        return None
    # Write last-used at most once a minute: a hot key would otherwise write every request.
    if key.last_used_at is None or now - key.last_used_at > dt.timedelta(minutes=1):
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
    return key


def _is_guest_key(key: ApiKey) -> bool:
    """A guest's key (one an admin made): guests have no API access."""
    try:
        return key.user.account.is_guest
    except Account.DoesNotExist:
        return False


def _rate_key(user: User, limits: Limits) -> str:
    if limits.guest_address:  # one window for all the guests of an address
        return f"ratelimit:guests:{limits.guest_address}"
    return f"ratelimit:{user.pk}"


def _key_rate_key(api_key: ApiKey) -> str:
    return f"ratelimit:key:{api_key.pk}"


def _key_tokens_today(api_key: ApiKey, now: dt.datetime) -> int:
    """The key's charged tokens today: summed from the ledger (only keys with limits of
    their own are asked, at their admissions and on their responses)."""
    start = dt.datetime.combine(_ledger_date(now), dt.time(), tzinfo=dt.UTC)
    total = UsageRecord.objects.filter(api_key=api_key, created_at__gte=start).aggregate(tokens=charged_tokens_sum())
    return int(total["tokens"] or 0)


def _ledger_sharers(user: User, limits: Limits, today: dt.date) -> QuerySet[Account]:
    """The user's account, and those whose day's tokens count against the same limits:
    for a guest, the other guests of its address that took tokens today."""
    sharing = Q(user=user)
    if limits.guest_address:
        sharing |= Q(is_guest=True, guest_address=limits.guest_address, ledger_day=today)
    return Account.objects.filter(sharing)


def _tokens_today(user: User, limits: Limits, now: dt.datetime) -> int:
    # Read afresh: the user's account may be a copy remembered with their key.
    today = _ledger_date(now)
    accounts = _ledger_sharers(user, limits, today).only("ledger_day", "ledger_day_tokens")
    return sum(account.tokens_used_on(today) for account in accounts)


def _ledger_date(moment: dt.datetime) -> dt.date:
    """The day a moment counts against: days begin at midnight UTC, as the quota resets."""
    return moment.astimezone(dt.UTC).date()


def _seconds_to_midnight(now: dt.datetime) -> int:
    tomorrow = (now + dt.timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return int((tomorrow - now).total_seconds())
