"""The audit trail in the admin, read-only for everyone; and AuditedAdmin, which records
the changes made through another model's admin."""

from __future__ import annotations

import csv
import json
from typing import Any

from django.contrib import admin
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from audit.models import AuditRecord
from audit.services import audit_record, changes_between, field_values, target_of
from infrastructure.spreadsheet import csv_cell

CSV_FIELDS = ["id", "created_at", "actor", "action", "target", "changes", "client_address", "request_id"]


@admin.register(AuditRecord)
class AuditRecordAdmin(admin.ModelAdmin):
    list_display = ["created_at", "actor_name", "action", "target", "client_address", "request_id"]
    list_filter = ["action", ("created_at", admin.DateFieldListFilter)]
    date_hierarchy = "created_at"
    search_fields = ["actor_name", "target", "request_id", "client_address"]
    list_select_related = ["actor"]
    actions = ["export_csv"]

    # Append-only: no one adds, changes or deletes a record here, superusers included.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.action(description="Export selected as CSV")
    def export_csv(self, request: HttpRequest, queryset: QuerySet[AuditRecord]) -> HttpResponse:
        response = HttpResponse(content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="audit-{timezone.now():%Y%m%d-%H%M%S}.csv"'
        writer = csv.writer(response)
        writer.writerow(CSV_FIELDS)
        count = 0
        for record in queryset.order_by("created_at", "pk"):
            count += 1
            writer.writerow(
                csv_cell(value)
                for value in [
                    record.pk,
                    record.created_at.isoformat(),
                    record.actor_name,
                    record.action,
                    record.target,
                    json.dumps(record.changes, ensure_ascii=False) if record.changes else "",
                    record.client_address or "",
                    record.request_id,
                ]
            )
        audit_record(action=AuditRecord.Action.EXPORT, target=f"audit.auditrecord, {count} records", request=request)
        return response


class AuditedAdmin(admin.ModelAdmin):
    """A model admin whose additions, changes and deletions are recorded in the audit trail,
    with the before and after of each field changed (secrets as "***"): the object's own
    form, its inlines' forms, and the changelist's editable rows alike."""

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        form.audit_before = self._saved_values(obj, form)
        super().save_model(request, obj, form, change)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)  # many-to-many fields, inlines
        self._record_change(request, form.instance, form, getattr(form, "audit_before", None))

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        before = {each: self._saved_values(each.instance, each) for each in formset.forms if each.has_changed()}
        super().save_formset(request, form, formset, change)
        for each in formset.deleted_objects:
            self._record_deletion(request, each)
        deleted = {obj.pk for obj in formset.deleted_objects}
        for each, values in before.items():
            if each.instance.pk is not None and each.instance.pk not in deleted:
                self._record_change(request, each.instance, each, values)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        self._record_deletion(request, obj)
        super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        for obj in queryset:
            self._record_deletion(request, obj)
        super().delete_queryset(request, queryset)

    @staticmethod
    def _saved_values(obj: models.Model, form: Any) -> dict[str, Any] | None:
        """The form's fields as they are saved now; None for an object not saved yet."""
        if obj.pk is None:
            return None
        saved = type(obj)._default_manager.filter(pk=obj.pk).first()
        return None if saved is None else field_values(saved, form.fields)

    @staticmethod
    def _record_change(request: HttpRequest, obj: models.Model, form: Any, before: dict[str, Any] | None) -> None:
        # Only what the form changed, as saved: a field the form shows as changed but keeps
        # (a write-only key left blank) is not a change.
        after = field_values(obj, form.changed_data if before is not None else form.fields)
        changes = changes_between(before or {}, after)
        if changes or before is None:
            audit_record(
                action=AuditRecord.Action.ADMIN_CHANGE, target=target_of(obj), changes=changes, request=request
            )

    @staticmethod
    def _record_deletion(request: HttpRequest, obj: models.Model) -> None:
        audit_record(action=AuditRecord.Action.ADMIN_DELETE, target=target_of(obj), request=request)
