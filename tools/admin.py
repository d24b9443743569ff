from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from tools.mcp_client import ToolServerError
from tools.models import ToolCallRecord, ToolServer
from tools.services import tool_server_tools


class ToolServerForm(forms.ModelForm):
    """Headers are written here and never shown again: blank keeps the ones saved."""

    url = forms.URLField(
        label="URL",
        max_length=500,
        assume_scheme="https",
        help_text="Its streamable-HTTP endpoint, e.g. http://host:8000/mcp.",
    )
    new_headers = forms.CharField(
        label="Headers",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "autocomplete": "off"}),
        help_text="One 'Name: value' a line (e.g. Authorization: Bearer …), sent with every request. "
        "Saved headers are never shown; blank keeps them.",
    )
    clear_headers = forms.BooleanField(label="Remove the saved headers", required=False)

    class Meta:
        model = ToolServer
        fields = ["name", "url", "allowed_plans", "timeout_s", "max_result_chars", "enabled"]

    def clean_new_headers(self) -> dict[str, str]:
        headers = {}
        for line in self.cleaned_data["new_headers"].splitlines():
            if not line.strip():
                continue
            name, colon, value = line.partition(":")
            if not colon or not name.strip() or any(c.isspace() for c in name.strip()):
                raise forms.ValidationError(f"Write each header as 'Name: value', not {line.strip()[:40]!r}.")
            headers[name.strip()] = value.strip()
        return headers

    def save(self, commit: bool = True) -> ToolServer:
        server = super().save(commit=False)
        if self.cleaned_data.get("clear_headers"):
            server.headers = {}
        if self.cleaned_data.get("new_headers"):
            server.headers = self.cleaned_data["new_headers"]
        if commit:
            server.save()
            self.save_m2m()
        return server


@admin.register(ToolServer)
class ToolServerAdmin(admin.ModelAdmin):
    form = ToolServerForm
    list_display = ["name", "url", "enabled", "from_environment", "header_names", "timeout_s", "max_result_chars"]
    list_filter = ["enabled", "from_environment"]
    filter_horizontal = ["allowed_plans"]
    readonly_fields = ["header_names", "tools_listed"]
    actions = ["refresh_tools"]

    # CHAT_TOOL_SERVERS owns its servers (tools.services.tool_servers_sync): shown, not edited.
    def has_change_permission(self, request: HttpRequest, obj: ToolServer | None = None) -> bool:
        return super().has_change_permission(request, obj) and not (obj and obj.from_environment)

    def has_delete_permission(self, request: HttpRequest, obj: ToolServer | None = None) -> bool:
        return super().has_delete_permission(request, obj) and not (obj and obj.from_environment)

    @admin.display(description="headers saved")
    def header_names(self, server: ToolServer) -> str:
        return ", ".join(sorted(server.headers)) or "—"

    @admin.display(description="tools")
    def tools_listed(self, server: ToolServer) -> str:
        if server.pk is None:
            return "—"
        try:
            return ", ".join(spec.name for spec in tool_server_tools(server=server)) or "none"
        except ToolServerError as error:
            return str(error)

    @admin.action(description="Refresh the tool lists of the selected servers")
    def refresh_tools(self, request: HttpRequest, queryset: QuerySet[ToolServer]) -> None:
        for server in queryset:
            try:
                listed = tool_server_tools(server=server, refresh=True)
            except ToolServerError as error:
                self.message_user(request, str(error), messages.ERROR)
            else:
                self.message_user(request, f"{server.name}: {len(listed)} tools.", messages.SUCCESS)


@admin.register(ToolCallRecord)
class ToolCallRecordAdmin(admin.ModelAdmin):
    list_display = ["name", "server", "status", "duration_ms", "created_at"]
    list_filter = ["status", "server"]
    date_hierarchy = "created_at"
    readonly_fields = [f.name for f in ToolCallRecord._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
