from __future__ import annotations

import re
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


def test_every_variable_is_listed_in_env_example_and_the_readme_table():
    names = set(re.findall(r'env_\w+\(\s*"([A-Z][A-Z0-9_]+)"', (ROOT / "chatsite" / "settings.py").read_text()))
    example = (ROOT / ".env.example").read_text()
    table = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `")]

    assert {"DJANGO_ALLOWED_HOSTS", "DJANGO_CSRF_TRUSTED_ORIGINS", "DJANGO_SECURE_HSTS_PRELOAD"} <= names
    assert [name for name in sorted(names) if not re.search(rf"^(# )?{name}=", example, re.MULTILINE)] == []
    assert [name for name in sorted(names) if not any(line.startswith(f"| `{name}` |") for line in table)] == []
