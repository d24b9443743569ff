"""Admin for conversations and messages, the live generations page (force stop), rated answers,
model servers, model fallbacks and the models' residency (unload now, keep warm)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.views.decorators.http import require_GET, require_POST

from accounts.models import UsageRecord
from audit.admin import AuditedAdmin
from audit.models import AuditRecord
from audit.services import audit_record, target_of
from generation import services
from generation.backends import runtime
from generation.backends.router import backend
from generation.models import (
    Conversation,
    Feedback,
    Message,
    ModelFallback,
    ModelResidency,
    SharedLink,
    UpstreamEndpoint,
)
from generation.residency import (
    ORDERS_EVERY_S,
    model_keep_warm_set,
    model_residency_orders,
    model_residency_rows,
    model_unload_request,
    plans_pinning,
)
from generation.selectors import MessageTree


class MessageInline(admin.TabularInline):
    model = Message
    fields = ("role", "status", "content", "completion_tokens", "ttft_ms", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ["__str__", "user", "model", "updated_at"]
    list_filter = ["model"]
    search_fields = ["title", "user__username"]
    inlines = [MessageInline]


class ForceStopForm(forms.Form):
    stream_id = forms.CharField(max_length=UsageRecord._meta.get_field("stream_id").max_length)


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ["id", "conversation", "role", "status", "completion_tokens", "ttft_ms", "created_at"]
    list_filter = ["status", "role", "model"]
    date_hierarchy = "created_at"
    raw_id_fields = ["conversation"]
    change_list_template = "admin/generation/message/change_list.html"
    actions = ["force_stop"]

    @admin.action(description="Force stop", permissions=["change"])
    def force_stop(self, request: HttpRequest, queryset: QuerySet[Message]) -> None:
        streaming = queryset.filter(status=Message.Status.STREAMING, stream_id__isnull=False)
        stopped = 0
        for message in streaming:
            if services.message_stop(message=message):
                stopped += 1
                _force_stop_recorded(request, message.stream_id or "")
        self.message_user(request, f"Asked {stopped} streaming answer(s) to stop.", messages.SUCCESS)

    def get_urls(self) -> list[URLPattern]:
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        live = [
            path("live/", self.admin_site.admin_view(require_GET(self.live_view)), name=f"{info}_live"),
            path(
                "live/stop/",
                self.admin_site.admin_view(require_POST(self.force_stop_view)),
                name=f"{info}_force_stop",
            ),
        ]
        # Before the defaults: their "<path:object_id>/" would take "live/".
        return [*live, *super().get_urls()]

    def live_view(self, request: HttpRequest) -> HttpResponse:
        """The generations running or waiting now, and this process's engines."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        store = runtime.stream_store()
        records = list(
            UsageRecord.objects.filter(status=UsageRecord.Status.STREAMING)
            .select_related("user", "api_key")
            .order_by("created_at")
        )
        alive = {producer: store.producer_alive(producer) for producer in {r.producer for r in records if r.producer}}
        rows = [{"record": record, "producer_alive": alive.get(record.producer)} for record in records]
        engines = backend().loads()
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Live generations",
            "rows": rows,
            "engines": engines,
            "producer": runtime.PRODUCER,
            "can_stop": self.has_change_permission(request),
        }
        return TemplateResponse(request, "admin/generation/message/live.html", context)

    def force_stop_view(self, request: HttpRequest) -> HttpResponse:
        """Set a stream's cancel flag; its producer stops within one decoding step."""
        if not self.has_change_permission(request):
            raise PermissionDenied
        form = ForceStopForm(request.POST)
        if not form.is_valid():
            self.message_user(request, "No stream to stop was given.", messages.ERROR)
        elif services.generation_cancel(stream_id=(stream_id := form.cleaned_data["stream_id"])):
            _force_stop_recorded(request, stream_id)
            self.message_user(request, f"Asked stream {stream_id} to stop.", messages.SUCCESS)
        else:
            self.message_user(
                request,
                f"Stream {stream_id} is not in the stream store: it has ended, or its process is gone "
                "(answers of stopped processes are marked interrupted when a server starts).",
                messages.WARNING,
            )
        return redirect(f"admin:{self.opts.app_label}_{self.opts.model_name}_live")


def _force_stop_recorded(request: HttpRequest, stream_id: str) -> None:
    audit_record(action=AuditRecord.Action.GENERATION_FORCE_STOPPED, target=f"stream:{stream_id}", request=request)


class UpstreamEndpointForm(forms.ModelForm):
    """The API key is written, never shown again: left empty, the saved one is kept."""

    api_key = forms.CharField(
        label="API key",
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Write-only: leave empty to keep the saved key.",
    )
    clear_api_key = forms.BooleanField(label="Remove the saved API key", required=False)
    base_url = forms.URLField(
        label="Base URL", max_length=500, assume_scheme="https", help_text="The API root, ending in /v1."
    )

    class Meta:
        model = UpstreamEndpoint
        fields = [
            "model",
            "base_url",
            "upstream_model",
            "api_key",
            "max_concurrent",
            "weight",
            "connect_timeout_s",
            "first_token_timeout_s",
            "read_timeout_s",
            "context_length",
            "tokenizer",
            "enabled",
        ]

    def clean_api_key(self) -> str:
        typed: str = self.cleaned_data["api_key"]
        if self.data.get("clear_api_key"):
            return ""
        return typed or (self.instance.api_key if self.instance.pk else "")


@admin.register(UpstreamEndpoint)
class UpstreamEndpointAdmin(AuditedAdmin):
    """Model servers; their live state is this web process's view of them. Edits are
    recorded in the audit trail, the API key as "***"."""

    form = UpstreamEndpointForm
    list_display = ["model", "base_url", "upstream_model", "enabled", "state", "in_flight", "errors", "ttft_ms"]
    list_filter = ["enabled", "model"]
    search_fields = ["model", "base_url", "upstream_model"]

    def _live(self, endpoint: UpstreamEndpoint) -> dict[str, Any]:
        name = endpoint.as_endpoint().name
        found = next((s for s in backend().endpoint_snapshots() if s["name"] == name), None)
        return found or {}

    @admin.display(description="state")
    def state(self, endpoint: UpstreamEndpoint) -> str:
        return str(self._live(endpoint).get("state", "off" if not endpoint.enabled else "not yet used"))

    @admin.display(description="in flight")
    def in_flight(self, endpoint: UpstreamEndpoint) -> Any:
        return self._live(endpoint).get("in_flight", 0)

    @admin.display(description="errors")
    def errors(self, endpoint: UpstreamEndpoint) -> Any:
        return self._live(endpoint).get("errors", 0)

    @admin.display(description="TTFT (ms)")
    def ttft_ms(self, endpoint: UpstreamEndpoint) -> Any:
        return self._live(endpoint).get("ttft_ms") or "—"

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        backend().endpoints_refresh()  # this process at once; the others within seconds

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        super().delete_model(request, obj)
        backend().endpoints_refresh()


@admin.register(ModelFallback)
class ModelFallbackAdmin(AuditedAdmin):
    """Each model's fallbacks, in order (lowest position first): the models that serve its
    requests when it cannot take them before their first token. Edits are recorded in the
    audit trail."""

    list_display = ["model", "position", "fallback", "updated_at"]
    list_editable = ["position", "fallback"]
    list_filter = ["model"]
    search_fields = ["model", "fallback"]


@admin.register(Feedback)
class FeedbackAdmin(admin.ModelAdmin):
    """Rated answers, read-only (they are their users' word), each linked to its conversation."""

    list_display = [
        "rating",
        "reason",
        "comment_start",
        "answer_model",
        "plan",
        "user",
        "conversation_link",
        "updated_at",
    ]
    list_filter = ["rating", "reason", "message__model", "message__conversation__user__account__plan"]
    date_hierarchy = "updated_at"
    search_fields = ["comment", "message__conversation__user__username"]
    list_select_related = ["message__conversation__user__account__plan"]
    fields = ("rating", "reason", "comment", "answer_model", "user", "conversation_link", "created_at", "updated_at")
    readonly_fields = fields
    change_list_template = "admin/generation/feedback/change_list.html"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Feedback | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Feedback | None = None) -> bool:
        return False

    @admin.display(description="comment")
    def comment_start(self, rated: Feedback) -> str:
        return rated.comment if len(rated.comment) <= 80 else rated.comment[:79] + "…"

    @admin.display(description="model", ordering="message__model")
    def answer_model(self, rated: Feedback) -> str:
        return rated.message.model

    @admin.display(description="plan")
    def plan(self, rated: Feedback) -> str:
        account = getattr(rated.message.conversation.user, "account", None)  # none yet: the default plan's
        return account.plan.name if account is not None else "—"

    @admin.display(description="user", ordering="message__conversation__user__username")
    def user(self, rated: Feedback) -> str:
        return rated.message.conversation.user.get_username()

    @admin.display(description="conversation")
    def conversation_link(self, rated: Feedback) -> str:
        url = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_conversation", args=[rated.pk])
        return format_html('<a href="{}#message-{}">{}</a>', url, rated.message_id, rated.message.conversation)

    def get_urls(self) -> list[URLPattern]:
        conversation = path(
            "<int:feedback_id>/conversation/",
            self.admin_site.admin_view(require_GET(self.conversation_view)),
            name=f"{self.opts.app_label}_{self.opts.model_name}_conversation",
        )
        return [conversation, *super().get_urls()]

    def conversation_view(self, request: HttpRequest, feedback_id: int) -> HttpResponse:
        """The rated answer in its conversation, read-only: the branch through it, with every rating."""
        if not (self.has_view_permission(request) and request.user.has_perm("generation.view_conversation")):
            raise PermissionDenied
        rated = get_object_or_404(Feedback.objects.select_related("message__conversation__user"), pk=feedback_id)
        conversation = rated.message.conversation
        tree = MessageTree(conversation)
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Rated answer in “{conversation}”",
            "conversation": conversation,
            "thread": tree.path(tree.newest_leaf(rated.message)),
            "rated": rated,
        }
        return TemplateResponse(request, "admin/generation/feedback/conversation.html", context)


@admin.register(SharedLink)
class SharedLinkAdmin(admin.ModelAdmin):
    """Share links, to see what is shared and take a link down (delete: it answers 404).
    The snapshot is the owner's words: shown, never edited here."""

    list_display = ["__str__", "owner", "created_at", "updated_at"]
    list_select_related = ["conversation__user"]
    search_fields = ["title", "conversation__user__username"]
    date_hierarchy = "updated_at"
    fields = readonly_fields = ("title", "conversation", "token", "messages", "created_at", "updated_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="owner", ordering="conversation__user__username")
    def owner(self, link: SharedLink) -> str:
        return link.conversation.user.get_username()


@admin.register(ModelResidency)
class ModelResidencyAdmin(AuditedAdmin):
    """The models this deployment runs itself, and the operator's word on each: "unload now"
    and "keep warm". Every process that runs a model (web processes, Celery workers) reads
    it from here within ORDERS_EVERY_S seconds; this process at once. The state shown is
    this process's. Each action is recorded in the audit trail."""

    list_display = ["model", "keep_warm", "pinned_by", "here", "unload_requested_at"]
    fields = ["model", "keep_warm", "pinned_by", "here", "unload_requested_at", "updated_at"]
    readonly_fields = ["model", "pinned_by", "here", "unload_requested_at", "updated_at"]
    actions = ["unload_now", "keep_warm_on", "keep_warm_off"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # a row per model served comes by itself (changelist_view)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if self.has_view_permission(request):
            model_residency_rows(runtime.model_names())
        return super().changelist_view(request, extra_context)

    @admin.display(description="pinned warm by plans")
    def pinned_by(self, row: ModelResidency) -> str:
        return ", ".join(plans_pinning(row.model)) or "—"

    @admin.display(description="in this process")
    def here(self, row: ModelResidency) -> str:
        engine = runtime.local_engines().get(row.model)
        if engine is None:
            return "not run here (Celery workers, or not used yet)"
        if engine.unload_pending:
            return f"{engine.residency}, unloading once its {engine.active + engine.queued} generation(s) end"
        return str(engine.residency)

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        _apply_here(obj.model)

    @admin.action(description="Unload now (once its running generations end)", permissions=["change"])
    def unload_now(self, request: HttpRequest, queryset: QuerySet[ModelResidency]) -> None:
        for row in queryset:
            if pins := plans_pinning(row.model):
                self.message_user(
                    request,
                    f"{row.model} is kept warm by the plan(s) {', '.join(pins)}: take it off their warm models first.",
                    messages.ERROR,
                )
                continue
            after = model_unload_request(model=row.model)
            _residency_recorded(request, row, after)
            self.message_user(request, _unload_outcome(row.model), messages.SUCCESS)

    @admin.action(description="Keep warm (load now if unloaded)", permissions=["change"])
    def keep_warm_on(self, request: HttpRequest, queryset: QuerySet[ModelResidency]) -> None:
        self._keep_warm(request, queryset, keep=True)

    @admin.action(description="Stop keeping warm", permissions=["change"])
    def keep_warm_off(self, request: HttpRequest, queryset: QuerySet[ModelResidency]) -> None:
        self._keep_warm(request, queryset, keep=False)

    def _keep_warm(self, request: HttpRequest, queryset: QuerySet[ModelResidency], *, keep: bool) -> None:
        for row in queryset:
            after = model_keep_warm_set(model=row.model, keep=keep)
            _residency_recorded(request, row, after)
            _apply_here(row.model)
        names = ", ".join(row.model for row in queryset)
        done = "kept warm (loaded now where unloaded)" if keep else "no longer kept warm by the admin"
        self.message_user(
            request,
            f"{names}: {done}; every process that runs them follows within {ORDERS_EVERY_S:g} s.",
            messages.SUCCESS,
        )


def _apply_here(model: str) -> None:
    """This process's engine of `model`, where it runs one, takes the orders now."""
    if (engine := runtime.local_engines().get(model)) is not None:
        engine.apply_orders(model_residency_orders(model))


def _unload_outcome(model: str) -> str:
    """Carry out "unload now" here, and say what came of it."""
    others = f"every other process that runs it follows within {ORDERS_EVERY_S:g} s, once its generations end"
    engine = runtime.local_engines().get(model)
    if engine is None:
        return f"{model}: {others}."
    orders = model_residency_orders(model)
    engine.apply_orders(orders)
    engine.unload_now(unloads_seen=orders.unloads)
    if engine.unload_pending:
        busy = engine.active + engine.queued
        return (
            f"{model} unloads here once its {busy} running or waiting generation(s) end (none is cut short); {others}."
        )
    return f"{model} is unloaded here; {others}."


def _residency_recorded(request: HttpRequest, before: ModelResidency, after: ModelResidency) -> None:
    changes = {
        name: (getattr(before, name), getattr(after, name))
        for name in ("keep_warm", "unload_requests")
        if getattr(before, name) != getattr(after, name)
    }
    audit_record(action=AuditRecord.Action.ADMIN_CHANGE, target=target_of(after), changes=changes, request=request)
