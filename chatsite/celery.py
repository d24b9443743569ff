"""Celery application; the generation workers of GENERATION_BACKEND=celery use it."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")

app = Celery("chatsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
