from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Case, F, Q, Sum, When
from django.utils import timezone

from inference.streams import GenerationStatus as CoreStatus

DEFAULT_PLAN = "default"
# The plan of guests (CHAT_GUEST): made by migration 0010, its limits editable in the admin.
GUEST_PLAN = "guest"
# Its limits when it is made: a taste of the chat, not a free account. Below the default
# plan's priority, so that guests wait behind members when generations queue.
GUEST_PLAN_LIMITS = {
    "requests_per_minute": 5,
    "tokens_per_day": 5_000,
    "max_concurrent_streams": 1,
    "max_tokens_per_request": 256,
    "priority": -1,
    "max_documents_per_conversation": 0,
    "max_conversations": 1,
}
KEY_PREFIX = "cs-"


class Plan(models.Model):
    name = models.CharField(max_length=100, unique=True)
    requests_per_minute = models.PositiveIntegerField(default=20)
    tokens_per_day = models.PositiveIntegerField(default=200_000)
    max_concurrent_streams = models.PositiveIntegerField(default=2)
    max_tokens_per_request = models.PositiveIntegerField(default=1024)
    # Waiting generations are taken by priority first, then in turns across users
    # (inference/fair_queue.py); equal priorities (the default) are simply taken in turns.
    priority = models.SmallIntegerField(
        default=0,
        # SQLite would store any integer; checked here as PostgreSQL checks it, on every database.
        validators=[MinValueValidator(-32768), MaxValueValidator(32767)],
        help_text="Higher is served first when generations wait for room: a plan at 10 is taken before one at 0. "
        "Plans of equal priority take turns, user by user.",
    )
    # Documents attached to a conversation (documents/): how many, and how big each file.
    max_documents_per_conversation = models.PositiveIntegerField(default=20)
    max_document_bytes = models.PositiveIntegerField(
        default=2_000_000, help_text="Capped by DATA_UPLOAD_MAX_MEMORY_SIZE, the limit of any request body."
    )
    # Who may use which model: a disallowed model is, to its users, a model that does not
    # exist (generation.services.models_for).
    allowed_models = models.JSONField(
        default=list, blank=True, help_text="The models this plan's users may use, one per line. Blank: every model."
    )
    max_conversations = models.PositiveIntegerField(
        null=True, blank=True, help_text="Conversations a user of this plan may keep. Blank: no limit."
    )
    # Models that stay in memory whatever CHAT_MODEL_IDLE_UNLOAD_S and CHAT_MAX_LOADED_MODELS
    # say (generation/residency.py): a paying plan's users never wait for a load.
    warm_models = models.JSONField(
        default=list,
        blank=True,
        help_text="Models kept in memory for this plan's users, one per line: never unloaded while idle.",
    )
    # The twofactor app asks for it: users without an authenticator are sent to set one up.
    require_two_factor = models.BooleanField(
        "require two-factor",
        default=False,
        help_text="Users of this plan must log in with a code from an authenticator app too (guests excepted).",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Team(models.Model):
    """Users who share limits and budgets (Budget.team): an admin makes it; a user belongs
    to one at most (Account.team). Keys may belong to it too (ApiKey.team, a service account)."""

    name = models.CharField(max_length=100, unique=True)
    requests_per_minute = models.PositiveIntegerField(
        null=True, blank=True, help_text="All its members and keys together. Blank: no limit of the team's."
    )
    max_concurrent_streams = models.PositiveIntegerField(
        null=True, blank=True, help_text="All its members and keys together. Blank: no limit of the team's."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Limits:
    requests_per_minute: int
    tokens_per_day: int
    max_concurrent_streams: int
    max_tokens_per_request: int
    # A guest's client address: every guest made from it shares these limits (one request
    # window, one day's tokens, one set of streams), so a new cookie resets nothing.
    guest_address: str | None = None


class Account(models.Model):
    """A user's plan, and per-user overrides of its limits (blank: the plan's)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="account")
    plan = models.ForeignKey(Plan, on_delete=models.PROTECT, related_name="accounts")
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_day = models.PositiveIntegerField(null=True, blank=True)
    max_concurrent_streams = models.PositiveIntegerField(null=True, blank=True)
    max_tokens_per_request = models.PositiveIntegerField(null=True, blank=True)
    # The day's running total of the ledger (a record's prompt tokens, plus its reserved
    # tokens while it streams and its completion tokens after), kept by accounts.services
    # under the row lock admission takes: admission reads one row instead of summing every
    # record of the day, which grew with a heavy user's day. `usage_recount` rebuilds it
    # from the ledger, the one truth.
    ledger_day = models.DateField(null=True, blank=True, editable=False)
    ledger_day_tokens = models.PositiveBigIntegerField(default=0, editable=False)
    # A guest (CHAT_GUEST) is a user with no password, kept by their session cookie alone,
    # until they sign up (accounts.services.guest_convert) or the purge removes them.
    is_guest = models.BooleanField("guest", default=False, editable=False)
    # The client address that made the guest: the guests of one address share their limits.
    guest_address = models.GenericIPAddressField(null=True, blank=True, editable=False, db_index=True)

    allowed_models = models.JSONField(
        default=list, blank=True, help_text="The models this user may use, in place of the plan's. Blank: the plan's."
    )
    team = models.ForeignKey(
        Team,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="members",
        help_text="Its limits and budgets cap all its members together, on top of each one's own.",
    )

    def __str__(self) -> str:
        return f"{self.user} on {self.plan}"

    def allows_model(self, name: str) -> bool:
        allowed = self.allowed_models or self.plan.allowed_models
        return not allowed or name in allowed

    def tokens_used_on(self, day: dt.date) -> int:
        return self.ledger_day_tokens if self.ledger_day == day else 0

    @property
    def limits(self) -> Limits:
        def pick(field: str) -> int:
            override = getattr(self, field)
            return int(getattr(self.plan, field) if override is None else override)

        return Limits(
            requests_per_minute=pick("requests_per_minute"),
            tokens_per_day=pick("tokens_per_day"),
            max_concurrent_streams=pick("max_concurrent_streams"),
            max_tokens_per_request=pick("max_tokens_per_request"),
            guest_address=self.guest_address if self.is_guest else None,
        )


# The limits an API key may have of its own, each within its owner's.
KEY_LIMIT_FIELDS = ("requests_per_minute", "tokens_per_day", "max_concurrent_streams")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiKey(models.Model):
    """An API key: shown once, stored as a SHA-256 hash with a display prefix."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, db_index=True)
    hashed = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # Limits of the key's own, within its owner's (blank: the owner's alone): a service's
    # key can be held to less than the person who made it. Checked at admission with the
    # owner's (accounts.services); the x-ratelimit headers report the tighter of the two.
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Refused from then on. Blank: never.")
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True, help_text="Blank: the owner's.")
    tokens_per_day = models.PositiveIntegerField(null=True, blank=True, help_text="Blank: the owner's.")
    max_concurrent_streams = models.PositiveIntegerField(null=True, blank=True, help_text="Blank: the owner's.")
    # A narrowing of what the owner may use: a model outside it is, to this key, a model
    # that does not exist.
    allowed_models = models.JSONField(
        default=list, blank=True, help_text="Of the owner's models, those this key may use, one per line. Blank: all."
    )
    # A service account's key: its requests count against the team's limits and budgets
    # (as well as its maker's), whoever of the team made it.
    team = models.ForeignKey(
        Team,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="api_keys",
        help_text="The team whose service account this key is. Blank: its owner's own key.",
    )

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    def expired(self, now: dt.datetime | None = None) -> bool:
        return self.expires_at is not None and self.expires_at <= (now or timezone.now())

    @property
    def has_limits(self) -> bool:
        return any(getattr(self, name) is not None for name in KEY_LIMIT_FIELDS)

    @staticmethod
    def generate() -> str:
        # 32 random bytes; the prefix tells a leaked key apart in logs and scanners.
        return KEY_PREFIX + secrets.token_urlsafe(32)

    def allows_model(self, name: str) -> bool:
        return not self.allowed_models or name in self.allowed_models

    def matches(self, key: str) -> bool:
        return hmac.compare_digest(self.hashed, hash_key(key))

    def revoke(self) -> None:
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            self.save(update_fields=["revoked_at"])


# A cost is kept to 10 decimal places: a token of a cheap model costs about 1e-8.
COST_DIGITS = 18
COST_PLACES = 10
PRICE_DIGITS = 12
PRICE_PLACES = 6


class Price(models.Model):
    """A model's price per million tokens from `valid_from` on, until a later price of it.

    A request pays the price valid when it was admitted (accounts.prices.price_at).
    """

    model = models.CharField(max_length=200, help_text="The model's name, as in /v1/models.")
    currency = models.CharField(
        max_length=3,
        default="USD",
        validators=[RegexValidator(r"^[A-Z]{3}$", "A three-letter code in capitals, such as USD.")],
    )
    input_per_million = models.DecimalField(
        "input", max_digits=PRICE_DIGITS, decimal_places=PRICE_PLACES, validators=[MinValueValidator(Decimal(0))]
    )
    cached_input_per_million = models.DecimalField(
        "cached input",
        max_digits=PRICE_DIGITS,
        decimal_places=PRICE_PLACES,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal(0))],
        help_text="The prompt of an answer from the response cache. Blank: the input price.",
    )
    output_per_million = models.DecimalField(
        "output", max_digits=PRICE_DIGITS, decimal_places=PRICE_PLACES, validators=[MinValueValidator(Decimal(0))]
    )
    charge_cache_hits = models.BooleanField(
        "charge the output of cache hits",
        default=False,
        help_text="An answer from the response cache: its output at the output price. Off: its output costs nothing.",
    )
    valid_from = models.DateTimeField(default=timezone.now, help_text="Requests admitted from then on pay this price.")

    class Meta:
        ordering = ["model", "-valid_from"]
        constraints = [models.UniqueConstraint(fields=["model", "valid_from"], name="price_unique_start")]

    def __str__(self) -> str:
        return f"{self.model} from {self.valid_from:%Y-%m-%d %H:%M} ({self.currency})"

    @property
    def cached_input(self) -> Decimal:
        return self.input_per_million if self.cached_input_per_million is None else self.cached_input_per_million


class GenerationStatus(models.TextChoices):
    """Where a generation stands: its usage record's status and its chat answer's alike."""

    # The names are the core's (inference.streams), which saves none of them itself.
    STREAMING = CoreStatus.STREAMING.value
    COMPLETE = CoreStatus.COMPLETE.value
    STOPPED = CoreStatus.STOPPED.value
    ERROR = CoreStatus.ERROR.value
    INTERRUPTED = CoreStatus.INTERRUPTED.value


class CacheOutcome(models.TextChoices):
    HIT = "hit"
    MISS = "miss"


class UsageRecord(models.Model):
    """One generation, whatever the channel: the one ledger quotas are checked against."""

    class Channel(models.TextChoices):
        UI = "ui"
        WS = "ws"
        API = "api"

    Status = GenerationStatus

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="usage_records")
    api_key = models.ForeignKey(ApiKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="usage")
    channel = models.CharField(max_length=8, choices=Channel.choices)
    model = models.CharField(max_length=200)
    stream_id = models.CharField(max_length=64, unique=True)
    # The engine generating it while streaming (see Engine.producer), to settle orphans.
    producer = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=20, choices=GenerationStatus.choices, default=GenerationStatus.STREAMING)
    finish_reason = models.CharField(max_length=20, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    # Reserved for the daily budget while streaming; replaced by the real count at the end.
    reserved_tokens = models.PositiveIntegerField(default=0)
    # The counts are estimates: the model server that generated it reported no usage.
    usage_estimated = models.BooleanField(default=False)
    # The response cache's verdict on a deterministic request: "hit" (the answer came from
    # the cache: no completion tokens counted) or "miss"; blank where the cache did not apply.
    cache = models.CharField(max_length=4, choices=CacheOutcome.choices, blank=True)
    # Tool calls the answer made (tools/: each run, failed or denied ones too), set as it settles.
    tool_calls = models.PositiveIntegerField(default=0)
    ttft_ms = models.PositiveIntegerField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    # What it cost at the model's price when it was admitted (accounts.prices), set as it
    # settles; null while it streams and where the model had no price.
    cost = models.DecimalField(max_digits=COST_DIGITS, decimal_places=COST_PLACES, null=True, blank=True)
    cost_currency = models.CharField(max_length=3, blank=True)
    # What money budgets hold for it while it streams: its prompt and reserved tokens at the
    # price of its admission (charged_cost_sum); its cost replaces it once settled.
    reserved_cost = models.DecimalField(
        max_digits=COST_DIGITS, decimal_places=COST_PLACES, null=True, blank=True, editable=False
    )
    # The team it counts against (its key's, else its user's then): kept on the record, so
    # that a member who leaves takes none of the team's history along.
    team = models.ForeignKey(Team, on_delete=models.SET_NULL, null=True, blank=True, related_name="usage")

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["user", "created_at"]),
            models.Index(fields=["user", "status"]),
            models.Index(fields=["team", "created_at"]),
            models.Index(fields=["api_key", "created_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.user} {self.channel} {self.model} {self.created_at:%Y-%m-%d %H:%M}"

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def charged_tokens(self) -> int:
        """What it takes from the day's budget: its prompt, and its reservation while it
        streams or what it generated once settled (the SQL form: charged_tokens_sum)."""
        if self.status == GenerationStatus.STREAMING:
            return self.prompt_tokens + self.reserved_tokens
        return self.prompt_tokens + self.completion_tokens


def charged_tokens_sum() -> Sum:
    """The sum of UsageRecord.charged_tokens over a queryset's records."""
    return Sum(
        Case(
            When(status=GenerationStatus.STREAMING, then=F("prompt_tokens") + F("reserved_tokens")),
            default=F("prompt_tokens") + F("completion_tokens"),
        )
    )


def charged_cost_sum() -> Sum:
    """The sum of what the records take from money budgets: the reservation of those that
    stream, the cost of the settled (records without a price count for nothing)."""
    return Sum(
        Case(When(status=GenerationStatus.STREAMING, then=F("reserved_cost")), default=F("cost")),
        output_field=models.DecimalField(max_digits=COST_DIGITS, decimal_places=COST_PLACES),
    )


class Budget(models.Model):
    """At most `amount` tokens or money per period for one subject: a plan (each of its
    users alone), an account, a key or a team (its members and keys together).

    Every budget that applies to a request holds (accounts.budgets): admission refuses
    what would pass one. Calendar periods begin at midnight in CHAT_BUDGET_TIME_ZONE.
    """

    class Period(models.TextChoices):
        DAY = "day"
        WEEK = "week", "week (from Monday)"
        MONTH = "month"
        ROLLING_30_DAYS = "rolling_30d", "rolling 30 days"

    class Unit(models.TextChoices):
        TOKENS = "tokens"
        MONEY = "money"

    plan = models.ForeignKey(Plan, on_delete=models.CASCADE, null=True, blank=True, related_name="budgets")
    account = models.ForeignKey(Account, on_delete=models.CASCADE, null=True, blank=True, related_name="budgets")
    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, null=True, blank=True, related_name="budgets")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, null=True, blank=True, related_name="budgets")
    period = models.CharField(max_length=12, choices=Period.choices)
    unit = models.CharField(max_length=6, choices=Unit.choices)
    amount = models.DecimalField(
        max_digits=COST_DIGITS,
        decimal_places=COST_PLACES,
        validators=[MinValueValidator(Decimal(0))],
        help_text="Tokens (a whole number), or money in the currency below.",
    )
    currency = models.CharField(
        max_length=3,
        default="USD",
        validators=[RegexValidator(r"^[A-Z]{3}$", "A three-letter code in capitals, such as USD.")],
        help_text="For a budget in money: only the costs in this currency count.",
    )
    soft_limit_percent = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        default=80,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="One alert a period once this share is used. Blank: none (spent still alerts).",
    )

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(plan__isnull=False, account__isnull=True, api_key__isnull=True, team__isnull=True)
                    | Q(plan__isnull=True, account__isnull=False, api_key__isnull=True, team__isnull=True)
                    | Q(plan__isnull=True, account__isnull=True, api_key__isnull=False, team__isnull=True)
                    | Q(plan__isnull=True, account__isnull=True, api_key__isnull=True, team__isnull=False)
                ),
                name="budget_one_subject",
                violation_error_message="A budget is for exactly one of a plan, an account, a key or a team.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.subject_kind} {self.subject_object}: {self.amount_shown}"

    @property
    def amount_shown(self) -> str:
        """The amount, its unit and period, for people: "5 USD per month"."""
        amount = f"{self.amount:f}".rstrip("0").rstrip(".") if "." in f"{self.amount:f}" else f"{self.amount:f}"
        unit = "tokens" if self.unit == self.Unit.TOKENS else self.currency
        period = self.get_period_display()
        return f"{amount or '0'} {unit} per {period[:1].lower()}{period[1:]}"

    @property
    def subject_kind(self) -> str:
        """What the budget is for: "plan", "account", "key" or "team"."""
        for kind, field in (("plan", "plan_id"), ("account", "account_id"), ("key", "api_key_id")):
            if getattr(self, field) is not None:
                return kind
        return "team"

    @property
    def subject_object(self) -> object:
        return self.plan or self.account or self.api_key or self.team

    def clean(self) -> None:
        subjects = [self.plan_id, self.account_id, self.api_key_id, self.team_id]
        if sum(subject is not None for subject in subjects) != 1:
            raise ValidationError("Choose exactly one of a plan, an account, a key or a team.")
        if self.unit == self.Unit.TOKENS and self.amount is not None and self.amount != self.amount.to_integral():
            raise ValidationError({"amount": "A budget in tokens is a whole number."})


class BudgetAlert(models.Model):
    """An alert sent (or being sent) for a budget: one per budget, subject, period and kind,
    which the unique constraint guarantees under any concurrency (accounts.alerts)."""

    class Kind(models.TextChoices):
        SOFT_LIMIT = "soft_limit", "soft limit reached"
        EXHAUSTED = "exhausted", "spent"

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="alerts")
    # Whose use crossed it: "user:<id>" for a plan's or account's budget, "key:<id>", "team:<id>".
    subject = models.CharField(max_length=40)
    period_start = models.DateTimeField()
    kind = models.CharField(max_length=12, choices=Kind.choices)
    used = models.DecimalField(max_digits=COST_DIGITS, decimal_places=COST_PLACES)
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    # When a round of attempts last began: a round that ended undelivered, or died with its
    # process, is begun again by accounts.alerts.alert_resend after ALERT_RESEND_AFTER.
    attempted_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["budget", "subject", "period_start", "kind"], name="budget_alert_once"),
        ]

    def __str__(self) -> str:
        return self.text


class UsageDay(models.Model):
    """A user's requests and finished tokens on one UTC day, per model and channel.

    Rolled up from the UsageRecord ledger by `accounts.services.usage_rollup`; never written
    by hand, so the ledger stays the one truth and this table can be recomputed at will.
    """

    day = models.DateField()
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="usage_days")
    model = models.CharField(max_length=200)
    channel = models.CharField(max_length=8, choices=UsageRecord.Channel.choices)
    requests = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    # Requests the response cache answered, and those it could have but had no answer for.
    cache_hits = models.PositiveIntegerField(default=0)
    cache_misses = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-day"]
        constraints = [
            models.UniqueConstraint(fields=["day", "user", "model", "channel"], name="usage_day_unique"),
        ]
        indexes = [models.Index(fields=["day"])]
        verbose_name = "usage day"

    def __str__(self) -> str:
        return f"{self.user} {self.channel} {self.model} {self.day:%Y-%m-%d}"

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens
