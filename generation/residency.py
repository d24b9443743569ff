"""What operators say of the models this deployment runs itself: "unload now", "keep warm"
(the admin's ModelResidency rows) and the plans that pin models warm (Plan.warm_models).

The database carries the word to every process that runs a model: each engine reads its
orders every ORDERS_EVERY_S seconds on its residency thread (inference/engine.py). That
works alike for the one embedded process with no Redis and for many web processes and
Celery workers, and a kept-warm model stays so across restarts. The process that serves
the admin's click applies it at once; the others within ORDERS_EVERY_S.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from accounts.models import Plan
from generation.models import ModelResidency
from inference.residency import ResidencyOrders

ORDERS_EVERY_S = 5.0


def plans_pinning(model: str) -> list[str]:
    """The names of the plans that keep `model` warm."""
    # In Python, not with `warm_models__contains`: SQLite has no JSON containment, and plans are few.
    return [name for name, warm in Plan.objects.values_list("name", "warm_models") if model in (warm or [])]


def model_residency_orders(model: str) -> ResidencyOrders:
    """`model`'s orders now: kept warm (by the admin or a plan), and how many times "unload
    now" was asked. (Engines read it through infrastructure.database's threads, which keep
    their connections and drop broken ones.)"""
    row = ModelResidency.objects.filter(model=model).values_list("keep_warm", "unload_requests").first()
    keep_warm, unloads = row or (False, 0)
    pinned = bool(plans_pinning(model))
    return ResidencyOrders(keep_warm=keep_warm or pinned, unloads=unloads)


def model_residency_rows(models: list[str]) -> None:
    """A row for each of these models, so the admin lists every model it can act on."""
    ModelResidency.objects.bulk_create([ModelResidency(model=name) for name in models], ignore_conflicts=True)


def model_keep_warm_set(*, model: str, keep: bool) -> ModelResidency:
    """Keep `model` in memory in every process (loaded now where it is out), or stop."""
    row, _ = ModelResidency.objects.update_or_create(model=model, defaults={"keep_warm": keep})
    return row


def model_unload_request(*, model: str) -> ModelResidency:
    """Ask every process to unload `model` once the generations it runs have ended; it is
    no longer kept warm. The caller checks plans_pinning first: a plan's pin outranks this."""
    with transaction.atomic():
        ModelResidency.objects.get_or_create(model=model)
        ModelResidency.objects.filter(model=model).update(
            keep_warm=False,
            unload_requests=F("unload_requests") + 1,
            unload_requested_at=timezone.now(),
            updated_at=timezone.now(),
        )
    return ModelResidency.objects.get(model=model)
