"""The generation app's management commands, run in-process."""

from __future__ import annotations

from io import StringIO

from django.core.management import call_command


def test_prepare_model_loads_the_configured_model_and_says_when_it_is_ready(settings):
    settings.CHAT_MODEL = "synthetic"
    settings.CHAT_ENABLE_SYNTHETIC = True
    out = StringIO()

    call_command("prepare_model", stdout=out)

    lines = out.getvalue().splitlines()
    assert lines[0].startswith("Preparing synthetic")
    assert lines[-1].startswith("synthetic ready in ")
