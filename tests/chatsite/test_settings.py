from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from chatsite.settings import (
    env_bool,
    env_choice,
    env_device,
    env_float,
    env_header,
    env_int,
    env_list,
    env_optional_int,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("raw", "expected"), [("1", True), ("true", True), ("on", True), ("0", False), ("no", False)])
def test_env_bool_reads_common_spellings(monkeypatch, raw, expected):
    monkeypatch.setenv("FLAG", raw)
    assert env_bool("FLAG", not expected) is expected


def test_env_bool_falls_back_to_default(monkeypatch):
    monkeypatch.delenv("FLAG", raising=False)
    assert env_bool("FLAG", True) is True


def test_env_bool_refuses_other_words_naming_the_variable(monkeypatch):
    monkeypatch.setenv("FLAG", "maybe")
    with pytest.raises(ImproperlyConfigured, match="FLAG"):
        env_bool("FLAG", False)


def test_env_int_parses_and_checks_the_minimum(monkeypatch):
    monkeypatch.setenv("COUNT", "12")
    assert env_int("COUNT", 3, minimum=1) == 12
    monkeypatch.setenv("COUNT", "")
    assert env_int("COUNT", 3) == 3
    for bad in ("twelve", "1.5", "0"):
        monkeypatch.setenv("COUNT", bad)
        with pytest.raises(ImproperlyConfigured, match="COUNT"):
            env_int("COUNT", 3, minimum=1)


def test_env_optional_int_is_none_when_unset(monkeypatch):
    monkeypatch.delenv("COUNT", raising=False)
    assert env_optional_int("COUNT", minimum=1) is None
    monkeypatch.setenv("COUNT", "4")
    assert env_optional_int("COUNT", minimum=1) == 4


def test_env_float_must_be_positive(monkeypatch):
    monkeypatch.setenv("RATE", "12.5")
    assert env_float("RATE", 1.0) == 12.5
    for bad in ("fast", "0", "-3"):
        monkeypatch.setenv("RATE", bad)
        with pytest.raises(ImproperlyConfigured, match="RATE"):
            env_float("RATE", 1.0)


def test_env_choice_and_list(monkeypatch):
    monkeypatch.setenv("MODE", "celery")
    assert env_choice("MODE", "inprocess", ("inprocess", "celery")) == "celery"
    monkeypatch.setenv("MODE", "threads")
    with pytest.raises(ImproperlyConfigured, match="MODE"):
        env_choice("MODE", "inprocess", ("inprocess", "celery"))
    monkeypatch.setenv("HOSTS", "a.example, b.example,,")
    assert env_list("HOSTS", "") == ["a.example", "b.example"]


@pytest.mark.parametrize("good", ["auto", "cpu", "cuda", "cuda:1"])
def test_env_device_accepts_devices(monkeypatch, good):
    monkeypatch.setenv("DEV", good)
    assert env_device("DEV", "auto") == good


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "tpu"])
def test_env_device_refuses_others(monkeypatch, bad):
    monkeypatch.setenv("DEV", bad)
    with pytest.raises(ImproperlyConfigured, match="DEV"):
        env_device("DEV", "auto")


def test_env_header_gives_the_request_meta_key(monkeypatch):
    monkeypatch.delenv("HEADER", raising=False)
    assert env_header("HEADER") is None
    monkeypatch.setenv("HEADER", "X-Real-IP")
    assert env_header("HEADER") == "HTTP_X_REAL_IP"
    monkeypatch.setenv("HEADER", "X Real IP")
    with pytest.raises(ImproperlyConfigured, match="HEADER"):
        env_header("HEADER")


def run_check(**env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL",)} | env
    return subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("DJANGO_DEBUG", "maybe"),
        ("GENERATION_MAX_QUEUE", "-1"),
        ("GENERATION_BACKEND", "threads"),
        ("GENERATION_BACKEND", "celery"),  # without REDIS_URL: no broker, no shared streams
        ("CHAT_AUTO_TITLE", "perhaps"),
        ("GENERATION_SCHEDULER", "parallel"),
        ("CHAT_DEVICE", "gpu"),
        ("CHAT_DTYPE", "int3"),
        ("CHAT_MODEL", "no-such-model"),
        ("CHAT_SYNTHETIC_TOKENS_PER_S", "0"),
        ("DATABASE_URL", "nosuchdb://x"),
        ("CHAT_SIGNUP", "invite"),
        ("CHAT_LOGIN_FAILURE_LIMIT", "0"),
        ("CHAT_LOGIN_LOCKOUT_MINUTES", "soon"),
        ("CHAT_CLIENT_IP_HEADER", "X-Forwarded-For: 1.2.3.4"),
    ],
)
def test_bad_value_stops_start_up_naming_the_variable(variable, value):
    result = run_check(**{variable: value})
    assert result.returncode != 0
    assert variable in result.stderr


def test_good_configuration_passes_the_check():
    result = run_check(
        DJANGO_DEBUG="1",
        GENERATION_MAX_QUEUE="8",
        CHAT_ENABLE_SYNTHETIC="1",
        CHAT_MODEL="synthetic",
        CHAT_SIGNUP="approval",
        CHAT_LOGIN_FAILURE_LIMIT="10",
        CHAT_LOGIN_LOCKOUT_MINUTES="60",
        CHAT_CLIENT_IP_HEADER="X-Forwarded-For",
    )
    assert result.returncode == 0, result.stderr
