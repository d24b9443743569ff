from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import AppConfig

if TYPE_CHECKING:
    from django.contrib.auth.models import User


class GenerationConfig(AppConfig):
    name = "generation"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Generations and titles are queued by task name (generation.backends.dispatch, .jobs), which
        # the tasks module's imports reach: register the tasks with Celery as Django starts,
        # in web processes as in workers, so that a named task is found (and runs eagerly
        # with the in-process backend).
        # The checks module registers the model settings' system checks.
        from accounts import model_access
        from generation import checks, tasks  # noqa: F401

        # The accounts app, a layer below, offers a key the models its owner may use (its settings page).
        model_access.models_offered_by(models_usable)


def models_usable(user: User) -> list[str]:
    """The models `user` may use, of every kind: the chat models, the site's default first,
    then the embedding models (a key's list of models narrows both)."""
    from generation.services import models_for

    return list(dict.fromkeys([*models_for(user=user), *models_for(user=user, kind="embedding")]))
