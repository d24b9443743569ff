"""Admin for plans, users with their plan, API keys and the usage ledger."""

from __future__ import annotations

import csv
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ERROR_FLAG, ORDER_VAR, PAGE_VAR
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db.models import Count, F, QuerySet, Sum
from django.db.models.functions import TruncDate
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone

from accounts.models import Account, ApiKey, Plan, UsageRecord

LIMIT_FIELDS = ["requests_per_minute", "tokens_per_day", "max_concurrent_streams", "max_tokens_per_request"]


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    list_display = ["name", *LIMIT_FIELDS]
    list_editable = LIMIT_FIELDS
    search_fields = ["name"]


class AccountInline(admin.StackedInline):
    model = Account
    can_delete = False
    max_num = 1
    fields = ["plan", *LIMIT_FIELDS]
    verbose_name = "plan and limits"
    verbose_name_plural = "plan and limits"

    def get_formset(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> Any:
        formset = super().get_formset(request, obj, **kwargs)
        for name in LIMIT_FIELDS:
            formset.form.base_fields[name].help_text = "Blank: the plan's limit."
        return formset


admin.site.unregister(User)


@admin.register(User)
class UserAdmin(BaseUserAdmin):
    inlines = [AccountInline]
    list_display = ["username", "email", "first_name", "last_name", "is_staff", "plan"]
    list_filter = ["is_staff", "is_superuser", "is_active", "groups", "account__plan"]
    list_select_related = ["account__plan"]

    @admin.display(description="plan", ordering="account__plan__name")
    def plan(self, user: User) -> str:
        account = getattr(user, "account", None)
        return account.plan.name if account is not None else "—"


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "shown_prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter), "created_at", "last_used_at"]
    search_fields = ["name", "prefix", "user__username"]
    list_select_related = ["user"]
    # The hash never appears: not in the form, not read-only, not searchable.
    fields = ["name", "user", "shown_prefix", "created_at", "last_used_at", "revoked_at"]
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
            key.revoke()
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
]


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
        "ttft_ms",
        "duration_ms",
    ]
    list_filter = [
        "channel",
        "model",
        "status",
        ("created_at", admin.DateFieldListFilter),
        ("user", admin.RelatedOnlyFieldListFilter),
    ]
    date_hierarchy = "created_at"
    search_fields = ["user__username", "stream_id", "model"]
    list_select_related = ["user", "api_key"]
    change_list_template = "admin/accounts/usagerecord/change_list.html"
    actions = ["export_csv"]

    # The ledger is written by generations only; admins read it.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.action(description="Export selected as CSV")
    def export_csv(self, request: HttpRequest, queryset: QuerySet[UsageRecord]) -> HttpResponse:
        response = HttpResponse(content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="usage-{timezone.now():%Y%m%d-%H%M%S}.csv"'
        writer = csv.writer(response)
        writer.writerow(CSV_FIELDS)
        for record in queryset.select_related("user", "api_key").order_by("created_at", "pk"):
            writer.writerow(
                [
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
                ]
            )
        return response

    def get_urls(self) -> list[URLPattern]:
        daily = path(
            "daily/",
            self.admin_site.admin_view(self.daily_view),
            name=f"{self.opts.app_label}_{self.opts.model_name}_daily",
        )
        # Before the defaults: their "<path:object_id>/" would take "daily/".
        return [daily, *super().get_urls()]

    def daily_view(self, request: HttpRequest) -> HttpResponse:
        """Requests and tokens per day, for the records the changelist's filters select."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        # The changelist's own filtering (list filters, date hierarchy, search, ?user=<id>),
        # without its paging and ordering.
        params = request.GET.copy()
        for param in (PAGE_VAR, ORDER_VAR, ERROR_FLAG):
            params.pop(param, None)
        request.GET = params  # type: ignore[assignment]  # the changelist reads request.GET
        try:
            changelist = self.get_changelist_instance(request)
        except IncorrectLookupParameters:
            changelist_url = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist")
            return HttpResponseRedirect(f"{changelist_url}?{ERROR_FLAG}=1")
        days = list(
            changelist.queryset.order_by()
            .annotate(day=TruncDate("created_at"))
            .values("day")
            .annotate(
                requests=Count("pk"),
                prompt=Sum("prompt_tokens"),
                completion=Sum("completion_tokens"),
                total=Sum(F("prompt_tokens") + F("completion_tokens")),
            )
            .order_by("-day")
        )
        totals = {name: sum(day[name] or 0 for day in days) for name in ("requests", "prompt", "completion", "total")}
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Usage per day",
            "days": days,
            "totals": totals,
            "filtered": bool(request.GET),
            "query_string": f"?{request.GET.urlencode()}" if request.GET else "",
        }
        return TemplateResponse(request, "admin/accounts/usagerecord/daily.html", context)
