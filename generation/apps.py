from django.apps import AppConfig


class GenerationConfig(AppConfig):
    name = "generation"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Generations and titles are queued by task name (generation.backends.dispatch, .jobs), which
        # the tasks module's imports reach: register the tasks with Celery as Django starts,
        # in web processes as in workers, so that a named task is found (and runs eagerly
        # with the in-process backend).
        # The checks module registers the model settings' system checks.
        from generation import checks, tasks  # noqa: F401
