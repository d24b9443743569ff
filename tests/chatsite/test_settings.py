from __future__ import annotations

import importlib.util
import os
import re
import secrets
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
    env_origins,
    env_proxy_ssl_header,
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


def test_env_origins_takes_origins_and_subdomain_wildcards(monkeypatch):
    monkeypatch.setenv("ORIGINS", "https://chat.example.com, https://*.example.org:8443,http://localhost:8000")
    assert env_origins("ORIGINS") == ["https://chat.example.com", "https://*.example.org:8443", "http://localhost:8000"]
    monkeypatch.setenv("ORIGINS", "")
    assert env_origins("ORIGINS") == []


@pytest.mark.parametrize(
    "bad",
    ["chat.example.com", "https://chat.example.com/", "https://chat.example.com/chat", "ftp://chat.example.com",
     "https://", "https://chat.example.com:port", "https://user@chat.example.com"],
)  # fmt: skip
def test_env_origins_refuses_what_is_not_an_origin(monkeypatch, bad):
    monkeypatch.setenv("ORIGINS", f"https://ok.example.com,{bad}")
    with pytest.raises(ImproperlyConfigured, match=f"ORIGINS: '{bad}' is not an origin"):
        env_origins("ORIGINS")


@pytest.mark.parametrize("raw", ["X-Forwarded-Proto:https", " X-Forwarded-Proto: https "])
def test_env_proxy_ssl_header_names_the_header_as_django_reads_it(monkeypatch, raw):
    monkeypatch.setenv("PROXY", raw)
    assert env_proxy_ssl_header("PROXY") == ("HTTP_X_FORWARDED_PROTO", "https")
    monkeypatch.delenv("PROXY")
    assert env_proxy_ssl_header("PROXY") is None


@pytest.mark.parametrize("bad", ["X-Forwarded-Proto", "X-Forwarded-Proto:", ":https", "X Forwarded:https"])
def test_env_proxy_ssl_header_refuses_a_header_without_its_value(monkeypatch, bad):
    monkeypatch.setenv("PROXY", bad)
    with pytest.raises(ImproperlyConfigured, match="PROXY"):
        env_proxy_ssl_header("PROXY")


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


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is not None, reason="bitsandbytes is installed")
def test_quantization_without_bitsandbytes_stops_start_up_saying_what_is_missing():
    result = run_check(CHAT_QUANTIZATION="bnb-4bit")
    assert result.returncode != 0
    assert "CHAT_QUANTIZATION" in result.stderr and "bitsandbytes" in result.stderr


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


# Production as README's "Behind an HTTPS proxy" sets it up.
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


def test_every_variable_is_listed_in_env_example_and_the_readme_table():
    names = set(re.findall(r'env_\w+\(\s*"([A-Z][A-Z0-9_]+)"', (ROOT / "chatsite" / "settings.py").read_text()))
    example = (ROOT / ".env.example").read_text()
    table = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `")]

    assert {"DJANGO_ALLOWED_HOSTS", "DJANGO_CSRF_TRUSTED_ORIGINS", "DJANGO_SECURE_HSTS_PRELOAD"} <= names
    assert [name for name in sorted(names) if not re.search(rf"^(# )?{name}=", example, re.MULTILINE)] == []
    assert [name for name in sorted(names) if not any(line.startswith(f"| `{name}` |") for line in table)] == []
