"""Celery application: the generation workers and housekeeping of GENERATION_BACKEND=celery.

Two kinds of worker (docs/scaling.md):
    celery -A chatsite worker -Q generation -P threads     loads the model; runs generations
    celery -A chatsite worker -Q housekeeping -B -c 2      runs beat and its housekeeping
"""

from __future__ import annotations

import os
import threading
from typing import Any

from celery import Celery
from celery.signals import celeryd_init, worker_ready, worker_shutting_down

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")

app = Celery("chatsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Where settings.CELERY_TASK_ROUTES sends generations and titles: workers that consume
# it load the model.
GENERATION_QUEUE = "generation"


# The handlers below import the generation worker when they run: this module is imported
# (by chatsite/__init__.py) before Django is set up, when no app module can be imported yet.


def _consumes_generation(queues: Any) -> bool:
    names = queues.split(",") if isinstance(queues, str) else list(queues or [])
    return GENERATION_QUEUE in names


@celeryd_init.connect
def _check_settings(**kwargs: Any) -> None:
    # No management command runs before a worker: a bad model or model-server setting
    # stops it here, naming its variable, as it stops daphne (chatsite/asgi.py), before
    # the next handler sizes the worker for the model. Celery logs and ignores a
    # handler's Exception, so the worker is stopped with SystemExit.
    import django
    from django.core.exceptions import ImproperlyConfigured

    django.setup()  # the checks are registered as the apps load; Celery sets up Django later
    from generation.checks import settings_check_or_stop

    try:
        settings_check_or_stop()
    except ImproperlyConfigured as error:
        raise SystemExit(f"chatsite: {error}") from None


@celeryd_init.connect
def _size_generation_worker(conf: Any = None, options: dict[str, Any] | None = None, **kwargs: Any) -> None:
    # Each generation task is a thread waiting for its generation in the shared engine:
    # a generation worker needs one per batch row and queue place, unless -c says otherwise.
    options = options or {}
    if _consumes_generation(options.get("queues")) and not options.get("concurrency"):
        from generation.worker import thread_count

        conf.worker_concurrency = thread_count()


@worker_ready.connect
def _start_generation_worker(sender: Any = None, **kwargs: Any) -> None:
    if _consumes_generation([queue.name for queue in sender.task_consumer.queues]):
        from generation import worker

        worker.start()


@worker_shutting_down.connect
def _drain_generation_worker(how: str | None = None, **kwargs: Any) -> None:
    # Sent from the signal handler: drain on a thread of its own, while Celery waits for
    # the running tasks (each one waits for its generation).
    if how == "Warm":
        from generation import worker

        threading.Thread(target=worker.shut_down, name="chatsite-drain").start()
