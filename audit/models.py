"""The audit trail's one model: records that are written once and never changed."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone


class AppendOnlyError(RuntimeError):
    """An audit record was to be changed or deleted: records are only ever added."""


class AuditRecordQuerySet(models.QuerySet["AuditRecord"]):
    def update(self, **kwargs: Any) -> int:
        # The one change allowed: the actor's user deleted (on_delete=SET_NULL, which
        # updates through this method); actor_name still says who it was.
        if kwargs != {"actor": None}:
            raise AppendOnlyError("Audit records are never changed.")
        return super().update(**kwargs)

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("Audit records are never deleted, but by the retention purge (audit_purge).")

    def purge(self) -> int:
        """Delete these records: for the retention purge (audit.services.audit_purge) alone."""
        deleted, _ = super().delete()
        return deleted


class AuditRecord(models.Model):
    """Who did what to what, from where, and when. Never prompt or answer text, never a secret."""

    class Action(models.TextChoices):
        LOGIN = "login", "log-in"
        LOGIN_FAILED = "login_failed", "log-in failed"
        LOCKED_OUT = "locked_out", "locked out"
        SIGNUP = "signup", "sign-up"
        USER_APPROVED = "user_approved", "user approved"
        PASSWORD_CHANGED = "password_changed", "password changed"
        KEY_CREATED = "key_created", "API key created"
        KEY_REVOKED = "key_revoked", "API key revoked"
        KEY_CHANGED = "key_changed", "API key's settings changed"
        REVOKED_KEY_USED = "revoked_key_used", "revoked API key used"
        ADMIN_CHANGE = "admin_change", "changed in the admin"
        ADMIN_DELETE = "admin_delete", "deleted in the admin"
        GENERATION_FORCE_STOPPED = "generation_force_stopped", "generation force-stopped"
        EXPORT = "export", "export"
        TWO_FACTOR_ENABLED = "two_factor_enabled", "two-factor turned on"
        TWO_FACTOR_DISABLED = "two_factor_disabled", "two-factor turned off"
        RECOVERY_CODES_REGENERATED = "recovery_codes_regenerated", "recovery codes regenerated"
        CLAIMS_APPLIED = "claims_applied", "plan or staff set at log-in"
        GUEST_ADOPTED = "guest_adopted", "guest's chat kept at log-in"

    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # Kept when the actor's user is deleted.
    actor_name = models.CharField(max_length=150, blank=True)
    action = models.CharField(max_length=32, choices=Action.choices)
    # What was acted on, e.g. "accounts.plan:3", "auth.user:5 alice", "username:alice".
    target = models.CharField(max_length=255, blank=True)
    # {field: [before, after]} of the fields changed; secrets appear as "***".
    changes = models.JSONField(default=dict, blank=True)
    client_address = models.GenericIPAddressField(null=True, blank=True)
    request_id = models.CharField(max_length=128, blank=True)

    objects = AuditRecordQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-pk"]
        verbose_name = "audit record"

    def __str__(self) -> str:
        return f"{self.get_action_display()} {self.target}".strip()

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise AppendOnlyError("Audit records are never changed.")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("Audit records are never deleted, but by the retention purge (audit_purge).")
