from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from accounts.forms import ModelNamesField
from guardrails import rule_cache, services
from guardrails.models import PolicyEvent, PolicyRule


class NamesField(ModelNamesField):
    """Channels and models, one per line."""


@admin.register(PolicyRule)
class PolicyRuleAdmin(admin.ModelAdmin):
    list_display = ["position", "name", "enabled", "matcher", "stage", "action"]
    list_display_links = ["name"]
    list_editable = ["position", "enabled"]
    list_filter = ["enabled", "matcher", "stage", "action"]
    search_fields = ["name", "pattern"]
    filter_horizontal = ["plans"]
    fieldsets = [
        (None, {"fields": ["name", "position", "enabled", "matcher", "pattern", "stage", "action", "message"]}),
        ("Scope (blank: everyone, every channel, every model)", {"fields": ["plans", "channels", "model_names"]}),
        (
            "Moderation service",
            {"fields": ["moderation_timeout_s", "moderation_fail_open", "moderation_token"], "classes": ["collapse"]},
        ),
    ]

    def formfield_for_dbfield(self, db_field, request, **kwargs):  # type: ignore[no-untyped-def]
        if db_field.name in ("channels", "model_names"):
            kwargs["form_class"] = NamesField
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    # A rule's own save and delete tell every process to read the rules afresh; its plans
    # are saved after it, and a bulk delete passes no rule's delete(): these tell them too.
    def save_related(self, request, form, formsets, change):  # type: ignore[no-untyped-def]
        super().save_related(request, form, formsets, change)
        rule_cache.policy_rules_changed()

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[PolicyRule]) -> None:
        super().delete_queryset(request, queryset)
        rule_cache.policy_rules_changed()


@admin.register(PolicyEvent)
class PolicyEventAdmin(admin.ModelAdmin):
    """The review queue: flags (and blocks, for the record), newest first."""

    list_display = ["created_at", "rule_name", "action", "stage", "user", "model", "excerpt", "review"]
    list_filter = ["review", "action", "stage", "rule_name"]
    search_fields = ["rule_name", "excerpt", "user__username"]
    date_hierarchy = "created_at"
    actions = ["keep", "redact", "delete_text"]
    readonly_fields = [f.name for f in PolicyEvent._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Keep: the text stays as it is", permissions=["change"])
    def keep(self, request: HttpRequest, queryset: QuerySet[PolicyEvent]) -> None:
        for event in queryset:
            services.policy_event_keep(event=event)
        self.message_user(request, f"Kept {len(queryset)} item(s).", messages.SUCCESS)

    @admin.action(description="Redact: replace the matched text wherever it is stored", permissions=["change"])
    def redact(self, request: HttpRequest, queryset: QuerySet[PolicyEvent]) -> None:
        for event in queryset:
            services.policy_event_redact(event=event)
        self.message_user(request, f"Redacted {len(queryset)} item(s).", messages.SUCCESS)

    @admin.action(description="Delete: remove the whole message's text", permissions=["change"])
    def delete_text(self, request: HttpRequest, queryset: QuerySet[PolicyEvent]) -> None:
        for event in queryset:
            services.policy_event_delete(event=event)
        self.message_user(request, f"Removed the text of {len(queryset)} item(s).", messages.SUCCESS)
