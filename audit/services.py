"""Writing the audit trail, and its retention purge."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import FieldDoesNotExist
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.http import HttpRequest
from django.utils import timezone

from audit.models import AuditRecord
from infrastructure import logs
from infrastructure.client_address import client_ip

REDACTED = "***"
# Fields whose values never reach the trail; that they changed does.
SECRET_FIELDS = frozenset({"password", "password1", "password2", "api_key", "hashed", "token", "secret"})
PURGE_BATCH = 1000


def audit_record(
    *,
    action: str,
    actor: User | AnonymousUser | None = None,
    target: str = "",
    changes: Mapping[str, tuple[Any, Any]] | None = None,
    request: HttpRequest | None = None,
) -> AuditRecord:
    """Append one record. The actor is the request's user unless given; the client address
    and request id are the request's. `changes` is {field: (before, after)}: values are
    stored as JSON, a secret field's as "***"."""
    if actor is None and request is not None:
        actor = getattr(request, "user", None)  # none on the API's requests (no middleware)
    user = actor if actor is not None and actor.is_authenticated else None
    return AuditRecord.objects.create(
        action=action,
        actor=user,
        actor_name=user.get_username() if user is not None else "",
        target=target[: AuditRecord._meta.get_field("target").max_length or 255],
        changes=_redacted(changes or {}),
        client_address=client_ip(request) if request is not None else None,
        request_id=logs.request_id() or "",
    )


def target_of(obj: models.Model, name: str = "") -> str:
    """An object as a target: "accounts.plan:3", or with a name that is no secret and no
    user's text beyond a name ("auth.user:5 alice")."""
    label = f"{obj._meta.label_lower}:{obj.pk}"
    return f"{label} {name}" if name else label


def field_values(obj: models.Model, names: Iterable[str]) -> dict[str, Any]:
    """The values of an object's model fields among `names` (others are skipped), as the
    trail stores them: a foreign key as its id, many-to-many as sorted ids."""
    values: dict[str, Any] = {}
    for name in names:
        try:
            field = obj._meta.get_field(name)
        except FieldDoesNotExist:  # a form's own field (a confirmation, a "clear" box), not the model's
            continue
        if not isinstance(field, models.Field) or field.auto_created:  # a reverse relation, the id
            continue
        if field.many_to_many:
            value: Any = sorted(related.pk for related in field.value_from_object(obj)) if obj.pk else []
        else:
            value = field.value_from_object(obj)
        values[name] = value
    return values


def changes_between(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{field: (before, after)} of the fields whose values differ; a field missing from
    `before` (an object added) was None."""
    changed: dict[str, tuple[Any, Any]] = {}
    for name, value in after.items():
        old = before.get(name)
        if _as_json(old) != _as_json(value):
            changed[name] = (old, value)
    return changed


def audit_purge(*, now: dt.datetime | None = None) -> int:
    """Delete the records older than CHAT_AUDIT_RETENTION_DAYS (0: keep them all); how many went.

    The one deletion records undergo: a queryset purge, past the per-record guard. In
    batches, so that each statement stays small whatever the backlog.
    """
    days = settings.CHAT_AUDIT_RETENTION_DAYS
    if days == 0:
        return 0
    cutoff = (now or timezone.now()) - dt.timedelta(days=days)
    old = AuditRecord.objects.filter(created_at__lt=cutoff)
    deleted = 0
    while ids := list(old.values_list("pk", flat=True)[:PURGE_BATCH]):
        deleted += AuditRecord.objects.filter(pk__in=ids).purge()
    return deleted


def _redacted(changes: Mapping[str, tuple[Any, Any]]) -> dict[str, list[Any]]:
    return {
        name: [_hidden(before), _hidden(after)] if _is_secret(name) else [_as_json(before), _as_json(after)]
        for name, (before, after) in changes.items()
    }


def _hidden(secret: Any) -> Any:
    # Whether there was one shows (a key set, or removed); never what it was.
    return secret if secret in (None, "") else REDACTED


def _is_secret(name: str) -> bool:
    return name in SECRET_FIELDS or name.endswith(("_password", "_secret", "_api_key"))


def _as_json(value: Any) -> Any:
    """A value as JSON holds it: dates as ISO text, objects by id, sets as sorted lists."""
    if isinstance(value, models.Model):
        return value.pk
    if isinstance(value, models.QuerySet):
        return sorted(each.pk for each in value)
    return json.loads(json.dumps(value, cls=_Encoder))


class _Encoder(DjangoJSONEncoder):
    def default(self, o: Any) -> Any:
        try:
            return super().default(o)
        except TypeError:
            return str(o)
