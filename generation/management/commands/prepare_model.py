from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from inference.generators import load_generator
from inference.registry import resolve_model


class Command(BaseCommand):
    help = "Convert the default model into MODEL_CACHE_DIR once, so the server starts fast."

    def handle(self, *args: Any, **options: Any) -> None:
        spec = resolve_model(settings.CHAT_MODEL, synthetic_enabled=settings.CHAT_ENABLE_SYNTHETIC)
        started = time.monotonic()
        self.stdout.write(f"Preparing {spec.name} (the first run converts it; later runs reuse the cache)…")
        load_generator(
            spec,
            cache_dir=settings.MODEL_CACHE_DIR,
            device="cpu",
            synthetic_tokens_per_s=settings.CHAT_SYNTHETIC_TOKENS_PER_S,
        )
        self.stdout.write(f"{spec.name} ready in {time.monotonic() - started:.1f} s.")
