"""What the Celery application does as a worker starts: which workers load the model, and
a bad model setting stopping it (tests/e2e/test_start_up.py starts a real worker)."""

from __future__ import annotations

import pytest

from chatsite import celery


@pytest.mark.parametrize(
    ("queues", "expected"),
    [
        ("generation", True),
        ("housekeeping,generation", True),
        (["generation"], True),
        ("housekeeping", False),
        (None, False),
    ],
)
def test_only_workers_that_consume_the_generation_queue_load_the_model(queues, expected):
    assert celery._consumes_generation(queues) is expected


def test_a_bad_model_setting_stops_the_worker_naming_the_variable(settings):
    settings.CHAT_MODEL = "no-such-model"
    with pytest.raises(SystemExit, match="CHAT_MODEL"):
        celery._check_settings()


def test_good_settings_let_the_worker_start():
    celery._check_settings()
