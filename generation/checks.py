"""System checks of the settings that only the inference core understands: the model, its
quantization and the model servers of CHAT_UPSTREAMS.

Django runs them with every management command (`check`, `migrate`, `prepare_model`);
web processes and Celery workers run them as they start (`settings_check_or_stop`), so
that a bad value stops start-up naming its variable while settings.py stays free of the
core's imports.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, register, run_checks
from django.core.exceptions import ImproperlyConfigured

from inference.registry import UnknownModel, resolve_model
from inference.upstream import Endpoint, endpoint_from_json

TAG = "chatsite"
# CHAT_QUANTIZATION's libraries: the package each value imports, and where it comes from.
QUANTIZATION_PACKAGES = {
    "int8": ("torchao", "requirements.lock"),
    "int4": ("torchao", "requirements.lock"),
    "bnb-4bit": ("bitsandbytes", "requirements-cuda.lock"),
    "bnb-8bit": ("bitsandbytes", "requirements-cuda.lock"),
}


def configured_upstreams() -> list[Endpoint]:
    """CHAT_UPSTREAMS's model servers, named env-1, env-2, …; ValueError naming what is wrong."""
    return [endpoint_from_json(entry, f"env-{index + 1}") for index, entry in enumerate(settings.CHAT_UPSTREAMS)]


@register(TAG)
def model_settings_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    try:
        resolve_model(settings.CHAT_MODEL, synthetic_enabled=settings.CHAT_ENABLE_SYNTHETIC)
    except UnknownModel as error:
        errors.append(Error(f"CHAT_MODEL: {error}", id="chatsite.E001"))
    package, where = QUANTIZATION_PACKAGES.get(settings.CHAT_QUANTIZATION, (None, ""))
    if package and importlib.util.find_spec(package) is None:
        errors.append(
            Error(
                f"CHAT_QUANTIZATION: {settings.CHAT_QUANTIZATION} needs the {package} package ({where}), "
                "which is not installed.",
                id="chatsite.E002",
            )
        )
    if settings.CHAT_QUANTIZATION == "int4" and (
        settings.CHAT_DTYPE not in ("auto", "bfloat16") or settings.CHAT_DEVICE.startswith("cuda")
    ):
        errors.append(
            Error(
                f"CHAT_QUANTIZATION: int4 runs on a CPU in bfloat16 (torchao's CPU int4 kernel), not with "
                f"CHAT_DEVICE={settings.CHAT_DEVICE} and CHAT_DTYPE={settings.CHAT_DTYPE}: set CHAT_DEVICE=cpu "
                "and CHAT_DTYPE=auto, or use bnb-4bit on a GPU.",
                id="chatsite.E004",
            )
        )
    try:
        configured_upstreams()
    except (ValueError, TypeError) as error:
        errors.append(Error(f"CHAT_UPSTREAMS: {error} (see docs/model-servers.md)", id="chatsite.E003"))
    return errors


def settings_check_or_stop() -> None:
    """Run this module's checks at a process's start, which no management command precedes
    (daphne, a Celery worker); a failed one stops it with the checks' words."""
    errors = [message for message in run_checks(tags=[TAG]) if message.is_serious()]
    if errors:
        raise ImproperlyConfigured("\n".join(message.msg for message in errors))
