"""The runtime's rules: how many generations an engine runs at once when nothing says."""

from __future__ import annotations

import pytest

from generation.backends import runtime
from inference.registry import SYNTHETIC_SPEC, ModelSpec

REAL = ModelSpec(name="a-real-model", source="/models/a-real-model")


@pytest.mark.parametrize(
    ("spec", "scheduler", "device", "expected"),
    [
        (SYNTHETIC_SPEC, "batched", "cpu", 1024),  # it only sleeps between words
        (REAL, "sequential", "cuda", 1),  # side-by-side generate() calls gain nothing
        (REAL, "batched", "cpu", 32),
        (REAL, "batched", "cuda:1", 256),
    ],
)
def test_default_concurrency_follows_the_model_the_scheduler_and_the_device(spec, scheduler, device, expected):
    assert runtime.default_concurrency(spec, scheduler, device) == expected


def test_generation_max_concurrent_overrides_the_default(settings):
    settings.GENERATION_MAX_CONCURRENT = 3
    assert runtime.max_concurrent(REAL) == 3


def test_a_runtime_used_for_a_test_is_replaced_and_given_back():
    mine = runtime.Runtime()
    previous = runtime.use(mine)
    try:
        assert runtime.current() is mine
        assert runtime.local_engines() == {}
    finally:
        runtime.use(previous)
    assert runtime.current() is previous
