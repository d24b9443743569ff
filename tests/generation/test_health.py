from __future__ import annotations

import threading

import pytest
from django.conf import settings

from generation.backends import runtime
from inference.engine import Engine
from inference.generators import SyntheticGenerator

pytestmark = pytest.mark.django_db


def test_healthz_answers_while_the_model_loads(client):
    assert client.get("/healthz").json() == {"status": "ok"}


def test_readyz_is_503_until_the_model_is_loaded_then_200(client, stream_store):
    release = threading.Event()

    def slow_load():
        release.wait(10)
        return SyntheticGenerator(tokens_per_s=100)

    engine = Engine(slow_load, stream_store)
    runtime.current().engines[settings.CHAT_MODEL] = engine

    loading = client.get("/readyz")
    assert loading.status_code == 503
    assert loading.json()["checks"]["model"] == "loading"
    release.set()
    assert engine.wait_ready(5)
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"]["database"] == "ok"
    if settings.REDIS_URL:
        assert ready.json()["checks"]["redis"] == "ok"
    engine.stop(5)


def test_readyz_reports_a_model_that_failed_to_load(client, stream_store):
    def broken():
        raise OSError("no weights")

    engine = Engine(broken, stream_store)
    runtime.current().engines[settings.CHAT_MODEL] = engine
    engine.start()
    assert not engine.wait_ready(5)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert "no weights" in response.json()["checks"]["model"]


def test_readyz_reports_unreachable_redis(client, fast_engine, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["redis"] != "ok"
