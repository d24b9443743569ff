"""Admin for plans, users with their plan, API keys and the usage ledger."""

from __future__ import annotations

import csv
import datetime as dt
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.options import IS_FACETS_VAR
from django.contrib.admin.views.main import ERROR_FLAG, ORDER_VAR, PAGE_VAR
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db import models
from django.db.models import F, Max, QuerySet, Sum
from django.db.models.functions import TruncDate
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone

from accounts.budgets import budget_zone
from accounts.forms import ModelNamesField
from accounts.key_cache import api_access_changed
from accounts.models import (
    KEY_LIMIT_FIELDS,
    Account,
    ApiKey,
    Budget,
    BudgetAlert,
    Plan,
    Price,
    Team,
    UsageDay,
    UsageRecord,
    charged_tokens_sum,
)
from accounts.periods import MONTH, window_of
from accounts.prices import cost_shown, cost_text
from accounts.services import api_key_revoke, team_spend, usage_recount
from accounts.usage_chart import spend_charts, usage_chart
from audit.admin import AuditedAdmin
from audit.models import AuditRecord
from audit.services import audit_record, target_of
from infrastructure.spreadsheet import csv_cell

LIMIT_FIELDS = ["requests_per_minute", "tokens_per_day", "max_concurrent_streams", "max_tokens_per_request"]
DOCUMENT_LIMIT_FIELDS = ["max_documents_per_conversation", "max_document_bytes"]


class ChangesApiAccess(AuditedAdmin):
    """An admin whose saves and deletions change who may use an API key, or with what limits:
    each makes every process read its remembered keys afresh (accounts.key_cache). Each is
    recorded in the audit trail, with the fields it changed (AuditedAdmin)."""

    formfield_overrides = {models.JSONField: {"form_class": ModelNamesField}}  # allowed_models, warm_models

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        api_access_changed()

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)  # the user's account, inline
        api_access_changed()

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        super().delete_model(request, obj)
        api_access_changed()

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        super().delete_queryset(request, queryset)
        api_access_changed()


class BudgetInline(admin.TabularInline):
    """A team's budgets (those of plans, accounts and keys are made in the budgets admin)."""

    model = Budget
    fields = ["period", "unit", "amount", "currency", "soft_limit_percent"]
    extra = 0


@admin.register(Plan)
class PlanAdmin(ChangesApiAccess):
    list_display = ["name", *LIMIT_FIELDS, "priority", *DOCUMENT_LIMIT_FIELDS, "max_conversations"]
    list_editable = [*LIMIT_FIELDS, "priority", *DOCUMENT_LIMIT_FIELDS, "max_conversations"]
    search_fields = ["name"]


@admin.register(Team)
class TeamAdmin(ChangesApiAccess):
    """Teams: members join on their user's page (plan and limits); a key becomes the team's
    (a service account's) on its own page under API keys."""

    list_display = ["name", "requests_per_minute", "max_concurrent_streams", "member_count", "month_usage"]
    fields = ["name", "requests_per_minute", "max_concurrent_streams", "members"]
    readonly_fields = ["members"]
    search_fields = ["name"]
    inlines = [BudgetInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Team]:
        return super().get_queryset(request).annotate(member_total=models.Count("members"))

    @admin.display(description="members", ordering="member_total")
    def member_count(self, team: Team) -> int:
        return int(getattr(team, "member_total", 0))

    @admin.display(description="members")
    def members(self, team: Team) -> str:
        return ", ".join(team.members.order_by("user__username").values_list("user__username", flat=True)) or "—"

    @admin.display(description="this month")
    def month_usage(self, team: Team) -> str:
        start = window_of(MONTH, timezone.now(), budget_zone()).start
        tokens, spend = team_spend(team=team, start=start)
        costs = ", ".join(f"{cost_shown(amount)} {currency}" for currency, amount in sorted(spend.items()))
        return f"{tokens:,} tokens" + (f"; {costs}" if costs else "")


@admin.register(Budget)
class BudgetAdmin(AuditedAdmin):
    list_display = ["__str__", "period", "unit", "amount", "currency", "soft_limit_percent"]
    list_filter = ["period", "unit", "currency"]
    raw_id_fields = ["account", "api_key"]
    fields = ["plan", "account", "api_key", "team", "period", "unit", "amount", "currency", "soft_limit_percent"]


@admin.register(BudgetAlert)
class BudgetAlertAdmin(admin.ModelAdmin):
    list_display = ["created_at", "kind", "text", "delivered_at"]
    list_filter = ["kind", ("delivered_at", admin.EmptyFieldListFilter)]
    date_hierarchy = "created_at"

    # Written by admissions only; sent once (accounts.alerts).
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class AccountInline(admin.StackedInline):
    model = Account
    can_delete = False
    max_num = 1
    fields = ["plan", *LIMIT_FIELDS, "allowed_models", "team"]
    formfield_overrides = ChangesApiAccess.formfield_overrides
    verbose_name = "plan and limits"
    verbose_name_plural = "plan and limits"

    def get_formset(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> Any:
        formset = super().get_formset(request, obj, **kwargs)
        for name in LIMIT_FIELDS:
            formset.form.base_fields[name].help_text = "Blank: the plan's limit."
        return formset


admin.site.unregister(User)


@admin.register(User)
class UserAdmin(ChangesApiAccess, BaseUserAdmin):  # type: ignore[misc]
    inlines = [AccountInline]
    list_display = ["username", "email", "first_name", "last_name", "is_active", "is_staff", "plan", "date_joined"]
    # "Active: No" lists the accounts awaiting approval (CHAT_SIGNUP=approval).
    list_filter = ["is_active", "is_staff", "is_superuser", "groups", "account__plan", "account__is_guest"]
    list_select_related = ["account__plan"]
    actions = ["approve"]

    @admin.action(description="Approve selected users (activate their accounts)", permissions=["change"])
    def approve(self, request: HttpRequest, queryset: QuerySet[User]) -> None:
        waiting = list(queryset.filter(is_active=False))
        approved = User.objects.filter(pk__in=[user.pk for user in waiting]).update(is_active=True)
        for user in waiting:
            target = target_of(user, user.get_username())
            audit_record(action=AuditRecord.Action.USER_APPROVED, target=target, request=request)
        self.message_user(request, f"Approved {approved} user(s): they can log in now.", messages.SUCCESS)

    def user_change_password(self, request: HttpRequest, id: str, form_url: str = "") -> HttpResponse:
        """Django's set-password page for a user, recorded in the audit trail once it saves."""
        response = super().user_change_password(request, id, form_url)
        if request.method == "POST" and response.status_code == 302:
            user = self.get_object(request, id)
            if user is not None:
                target = target_of(user, user.get_username())
                audit_record(action=AuditRecord.Action.PASSWORD_CHANGED, target=target, request=request)
        return response

    @admin.display(description="plan", ordering="account__plan__name")
    def plan(self, user: User) -> str:
        account = getattr(user, "account", None)
        return account.plan.name if account is not None else "—"


@admin.register(ApiKey)
class ApiKeyAdmin(ChangesApiAccess):
    list_display = ["name", "user", "shown_prefix", "created_at", "last_used_at", "expires_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter), "created_at", "last_used_at"]
    search_fields = ["name", "prefix", "user__username"]
    list_select_related = ["user"]
    # The hash never appears: not in the form, not read-only, not searchable.
    fields = [
        "name",
        "user",
        "team",
        "shown_prefix",
        "expires_at",
        *KEY_LIMIT_FIELDS,
        "allowed_models",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    exclude = ["hashed"]
    readonly_fields = ["user", "shown_prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Keys are made on the API-key page, the one place that can show the plain key.
        return False

    @admin.display(description="key", ordering="prefix")
    def shown_prefix(self, key: ApiKey) -> str:
        return f"{key.prefix}…"

    @admin.action(description="Revoke selected keys", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        keys = list(queryset.filter(revoked_at__isnull=True))
        for key in keys:
            api_key_revoke(key=key, request=request)
        self.message_user(request, f"Revoked {len(keys)} key(s).", messages.SUCCESS)


CSV_FIELDS = [
    "id",
    "created_at",
    "user",
    "api_key",
    "channel",
    "model",
    "stream_id",
    "status",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "ttft_ms",
    "duration_ms",
    "cost",
    "cost_currency",
]

SPEND_CSV_FIELDS = ["day", "user", "team", "api_key", "model", "requests", "tokens", "spend", "currency"]


@admin.register(Price)
class PriceAdmin(AuditedAdmin):
    """Prices per million tokens; a change is a new price from a later date, so that the
    requests admitted before it keep theirs."""

    list_display = [
        "model",
        "valid_from",
        "currency",
        "input_per_million",
        "cached_input_per_million",
        "output_per_million",
        "charge_cache_hits",
    ]
    list_filter = ["model", "currency", "charge_cache_hits"]
    search_fields = ["model"]
    date_hierarchy = "valid_from"


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = [
        "created_at",
        "user",
        "api_key",
        "channel",
        "model",
        "status",
        "finish_reason",
        "prompt_tokens",
        "completion_tokens",
        "cache",
        "tool_calls",
        "ttft_ms",
        "duration_ms",
        "shown_cost",
    ]
    list_filter = [
        "channel",
        "model",
        "status",
        "cache",
        ("created_at", admin.DateFieldListFilter),
        ("user", admin.RelatedOnlyFieldListFilter),
    ]
    date_hierarchy = "created_at"
    search_fields = ["user__username", "stream_id", "model"]
    list_select_related = ["user", "api_key"]
    change_list_template = "admin/accounts/usagerecord/change_list.html"
    actions = ["export_csv", "export_spend_csv"]

    # The ledger is written by generations only; admins read it.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    # A deleted record no longer counts against its user's day: their running total is rebuilt.
    def delete_model(self, request: HttpRequest, obj: UsageRecord) -> None:
        super().delete_model(request, obj)
        usage_recount(user_ids=[obj.user_id])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[UsageRecord]) -> None:
        user_ids = list(queryset.order_by().values_list("user_id", flat=True).distinct())
        super().delete_queryset(request, queryset)
        usage_recount(user_ids=user_ids)

    @admin.action(description="Export selected as CSV")
    def export_csv(self, request: HttpRequest, queryset: QuerySet[UsageRecord]) -> HttpResponse:
        response = HttpResponse(content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="usage-{timezone.now():%Y%m%d-%H%M%S}.csv"'
        writer = csv.writer(response)
        writer.writerow(CSV_FIELDS)
        for record in queryset.select_related("user", "api_key").order_by("created_at", "pk"):
            writer.writerow(
                csv_cell(value)
                for value in [
                    record.pk,
                    record.created_at.isoformat(),
                    record.user.get_username(),
                    record.api_key.prefix if record.api_key else "",
                    record.channel,
                    record.model,
                    record.stream_id,
                    record.status,
                    record.finish_reason,
                    record.prompt_tokens,
                    record.completion_tokens,
                    "" if record.ttft_ms is None else record.ttft_ms,
                    "" if record.duration_ms is None else record.duration_ms,
                    "" if record.cost is None else cost_text(record.cost),
                    record.cost_currency,
                ]
            )
        count = queryset.count()
        audit_record(action=AuditRecord.Action.EXPORT, target=f"accounts.usagerecord, {count} records", request=request)
        return response

    @admin.action(description="Export spend per day, user, team, key and model as CSV")
    def export_spend_csv(self, request: HttpRequest, queryset: QuerySet[UsageRecord]) -> HttpResponse:
        """The selected records summed per day (in CHAT_BUDGET_TIME_ZONE), user, team, key,
        model and currency: requests, charged tokens and spend, exactly."""
        response = HttpResponse(content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="spend-{timezone.now():%Y%m%d-%H%M%S}.csv"'
        writer = csv.writer(response)
        writer.writerow(SPEND_CSV_FIELDS)
        rows = (
            queryset.annotate(day=TruncDate("created_at", tzinfo=budget_zone()))
            .values("day", "user__username", "team__name", "api_key__prefix", "model", "cost_currency")
            .annotate(request_count=models.Count("pk"), tokens=charged_tokens_sum(), spent=Sum("cost"))
            .order_by("day", "user__username", "team__name", "api_key__prefix", "model", "cost_currency")
        )
        for row in rows:
            spent = row["spent"]
            writer.writerow(
                csv_cell(value)
                for value in [
                    row["day"].isoformat(),
                    row["user__username"],
                    row["team__name"] or "",
                    row["api_key__prefix"] or "",
                    row["model"],
                    row["request_count"],
                    row["tokens"] or 0,
                    "" if spent is None else cost_text(spent),
                    row["cost_currency"],
                ]
            )
        count = queryset.count()
        audit_record(
            action=AuditRecord.Action.EXPORT, target=f"accounts.usagerecord spend, {count} records", request=request
        )
        return response

    @admin.display(description="cost", ordering="cost")
    def shown_cost(self, record: UsageRecord) -> str:
        return "" if record.cost is None else f"{cost_shown(record.cost)} {record.cost_currency}"

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """The ledger, under charts of the last 30 days' tokens and spend per day per plan."""
        charts = {"usage_chart": usage_chart(), "spend_charts": spend_charts()}
        return super().changelist_view(request, {**charts, **(extra_context or {})})

    def get_urls(self) -> list[URLPattern]:
        daily = path(
            "daily/",
            self.admin_site.admin_view(self.daily_view),
            name=f"{self.opts.app_label}_{self.opts.model_name}_daily",
        )
        # Before the defaults: their "<path:object_id>/" would take "daily/".
        return [daily, *super().get_urls()]

    def daily_view(self, request: HttpRequest) -> HttpResponse:
        """Requests and tokens per UTC day, from UsageDay, for the changelist's filters that apply."""
        # Whoever may read the ledger may read its totals.
        if not self.has_view_permission(request):
            raise PermissionDenied
        params = request.GET.copy()
        for param in (PAGE_VAR, ORDER_VAR, ERROR_FLAG, IS_FACETS_VAR):
            params.pop(param, None)
        form = DailyFilterForm(params)
        if not form.is_valid():
            changelist_url = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist")
            return HttpResponseRedirect(f"{changelist_url}?{ERROR_FLAG}=1")
        days = list(
            form.filter(UsageDay.objects.all())
            .values("day")
            .annotate(
                request_count=Sum("requests"),
                prompt=Sum("prompt_tokens"),
                completion=Sum("completion_tokens"),
                total=Sum(F("prompt_tokens") + F("completion_tokens")),
                hits=Sum("cache_hits"),
                misses=Sum("cache_misses"),
            )
            .order_by("-day")
        )
        names = ("request_count", "prompt", "completion", "total", "hits", "misses")
        totals = {name: sum(day[name] for day in days) for name in names}
        for row in [*days, totals]:
            row["hit_rate"] = cache_hit_rate(row["hits"], row["misses"])
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Usage per day",
            "days": days,
            "totals": totals,
            "filtered": form.applied(),
            "ignored": form.ignored(),
            "updated_at": UsageDay.objects.aggregate(last=Max("updated_at"))["last"],
            "query_string": f"?{params.urlencode()}" if params else "",
        }
        return TemplateResponse(request, "admin/accounts/usagerecord/daily.html", context)


def cache_hit_rate(hits: int, misses: int) -> str:
    """The share of cacheable requests the response cache answered, as shown; "-" for none."""
    return f"{hits / (hits + misses):.0%} ({hits} of {hits + misses})" if hits + misses else "-"


class DailyFilterForm(forms.Form):
    """The usage changelist's filters that daily totals keep, under the changelist's own names.

    UsageDay has no status, key or stream id: the other filters can't apply and are named
    on the page rather than silently dropped.
    """

    user = forms.IntegerField(required=False)
    user__id__exact = forms.IntegerField(required=False)
    model__exact = forms.CharField(max_length=200, required=False)
    channel__exact = forms.ChoiceField(choices=UsageRecord.Channel.choices, required=False)
    created_at__gte = forms.DateTimeField(required=False)
    created_at__lt = forms.DateTimeField(required=False)
    created_at__year = forms.IntegerField(min_value=1, max_value=9999, required=False)
    created_at__month = forms.IntegerField(min_value=1, max_value=12, required=False)
    created_at__day = forms.IntegerField(min_value=1, max_value=31, required=False)

    def filter(self, days: QuerySet[UsageDay]) -> QuerySet[UsageDay]:
        data = self.cleaned_data
        lookups = {
            "user_id": data["user"] if data["user"] is not None else data["user__id__exact"],
            "model": data["model__exact"],
            "channel": data["channel__exact"],
            # The changelist's date filters pick local days; totals are kept per UTC day.
            "day__gte": _local_date(data["created_at__gte"]),
            "day__lt": _local_date(data["created_at__lt"]),
            "day__year": data["created_at__year"],
            "day__month": data["created_at__month"],
            "day__day": data["created_at__day"],
        }
        return days.filter(**{lookup: value for lookup, value in lookups.items() if value not in (None, "")})

    def applied(self) -> bool:
        return any(value not in (None, "") for value in self.cleaned_data.values())

    def ignored(self) -> list[str]:
        """The changelist's filters in the query that daily totals can't apply, by field."""
        names = {"search" if param == "q" else param.split("__")[0] for param in self.data if param not in self.fields}
        return sorted(names)


def _local_date(value: dt.datetime | None) -> dt.date | None:
    return None if value is None else timezone.localtime(value).date()


@admin.register(UsageDay)
class UsageDayAdmin(admin.ModelAdmin):
    list_display = [
        "day",
        "user",
        "model",
        "channel",
        "requests",
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "cache_hits",
        "cache_misses",
    ]
    list_filter = [
        "channel",
        "model",
        ("day", admin.DateFieldListFilter),
        ("user", admin.RelatedOnlyFieldListFilter),
    ]
    date_hierarchy = "day"
    search_fields = ["user__username", "model"]
    list_select_related = ["user"]

    # Rolled up from the ledger by usage_rollup; an edit would be overwritten a minute later.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
