"""Start-up with bad, good and production configurations: `manage.py check` in a process
of its own, as a deployment starts (the settings helpers are tested in-process in
tests/chatsite/test_settings.py)."""

from __future__ import annotations

import importlib.util
import os
import re
import secrets
import subprocess
import sys

import pytest

from tests.support.livesite import ROOT


def run_check(*options: str, **env: str) -> subprocess.CompletedProcess:
    # Only the variables given here: none of the caller's DJANGO_* or REDIS_URL.
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_") and k != "REDIS_URL"}
    return subprocess.run(
        [sys.executable, "manage.py", "check", *options],
        cwd=ROOT,
        env=inherited | env,
        capture_output=True,
        text=True,
        timeout=60,
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
        ("CHAT_QUANTIZATION", "bnb-3bit"),
        ("GENERATION_CUDA_GRAPHS", "yes"),
        ("GENERATION_SLOT_TOKENS", "8"),
        ("CHAT_MODEL", "no-such-model"),
        ("CHAT_SYNTHETIC_TOKENS_PER_S", "0"),
        ("DATABASE_URL", "nosuchdb://x"),
        ("CHAT_SIGNUP", "invite"),
        ("CHAT_LOGIN_FAILURE_LIMIT", "0"),
        ("CHAT_LOGIN_LOCKOUT_MINUTES", "soon"),
        ("CHAT_CLIENT_IP_HEADER", "X-Forwarded-For: 1.2.3.4"),
        ("DJANGO_CSRF_TRUSTED_ORIGINS", "chat.example.com"),
        ("DJANGO_SECURE_PROXY_SSL_HEADER", "X-Forwarded-Proto"),
        ("DJANGO_SECURE_SSL_REDIRECT", "always"),
        ("DJANGO_SECURE_COOKIES", "secure"),
        ("DJANGO_SECURE_HSTS_SECONDS", "a year"),
        ("DJANGO_SECURE_HSTS_SECONDS", "-1"),
        ("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", "all"),
        ("DJANGO_SECURE_HSTS_PRELOAD", "please"),
    ],
)
def test_bad_value_stops_start_up_naming_the_variable(variable, value):
    result = run_check(**{variable: value})
    assert result.returncode != 0
    assert variable in result.stderr


def test_a_bad_model_setting_stops_a_celery_worker_naming_the_variable():
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_") and k != "REDIS_URL"}
    worker = [sys.executable, "-m", "celery", "-A", "chatsite", "worker", "-Q", "generation", "-P", "threads"]
    result = subprocess.run(
        worker, cwd=ROOT, env=inherited | {"CHAT_MODEL": "no-such-model"}, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "CHAT_MODEL" in result.stderr


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is not None, reason="bitsandbytes is installed")
def test_quantization_without_bitsandbytes_stops_start_up_saying_what_is_missing():
    result = run_check(CHAT_QUANTIZATION="bnb-4bit")
    assert result.returncode != 0
    assert "CHAT_QUANTIZATION" in result.stderr
    assert "bitsandbytes" in result.stderr


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


# Production as docs/deployment.md's "Behind an HTTPS proxy" sets it up.
PRODUCTION = {
    "DJANGO_DEBUG": "0",
    "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
    "DJANGO_ALLOWED_HOSTS": "chat.example.com",
    "DJANGO_CSRF_TRUSTED_ORIGINS": "https://chat.example.com",
    "DJANGO_SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto:https",
    "DJANGO_SECURE_SSL_REDIRECT": "1",
    "DJANGO_SECURE_COOKIES": "1",
    "DJANGO_SECURE_HSTS_SECONDS": "31536000",
    "DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS": "1",
    "DJANGO_SECURE_HSTS_PRELOAD": "1",
}


def test_deploy_check_is_clean_with_production_settings():
    result = run_check("--deploy", "--fail-level", "WARNING", **PRODUCTION)

    assert result.returncode == 0, result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout


def test_deploy_check_names_each_https_setting_left_at_its_plain_http_default():
    plain = {name: value for name, value in PRODUCTION.items() if "SECURE" not in name}

    result = run_check("--deploy", "--fail-level", "WARNING", **plain)

    assert result.returncode != 0
    warnings = set(re.findall(r"\(security\.(W\d+)\)", result.stderr))
    # HSTS, SSL redirect, session cookie, CSRF cookie: and nothing else.
    assert warnings == {"W004", "W008", "W012", "W016"}
