"""Single sign-on's settings fail at start-up, naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from chatsite.settings import env_url
from tests.support.livesite import ROOT

GOOD = {
    "CHAT_OIDC_ISSUER": "https://sso.example.com/realms/staff",
    "CHAT_OIDC_CLIENT_ID": "chatsite",
    "CHAT_OIDC_CLIENT_SECRET": "s3cret",
}


def start_up(**env: str) -> subprocess.CompletedProcess[str]:
    names = [*GOOD, "CHAT_OIDC_SCOPES", "CHAT_PASSWORD_LOGIN"]
    clean = {name: value for name, value in os.environ.items() if name not in names}
    return subprocess.run(
        [sys.executable, "-c", "import chatsite.settings"],
        cwd=ROOT,
        env={**clean, "DJANGO_SECRET_KEY": "test", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "good", ["https://sso.example.com/realms/staff", "http://127.0.0.1:9400", "https://accounts.example.com/"]
)
def test_env_url_takes_http_and_https_urls_without_the_trailing_slash(monkeypatch, good):
    monkeypatch.setenv("ISSUER", good)
    assert env_url("ISSUER") == good.rstrip("/")


@pytest.mark.parametrize(
    "bad", ["sso.example.com", "ftp://sso.example.com", "https://", "https://x.example.com/?a=1", "http://h:port"]
)
def test_env_url_refuses_what_is_not_a_url_naming_the_variable(monkeypatch, bad):
    monkeypatch.setenv("ISSUER", bad)
    with pytest.raises(ImproperlyConfigured, match="ISSUER"):
        env_url("ISSUER")


def test_a_complete_configuration_starts():
    assert start_up(**GOOD).returncode == 0


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({**GOOD, "CHAT_OIDC_ISSUER": "sso.example.com"}, "CHAT_OIDC_ISSUER"),
        ({"CHAT_OIDC_ISSUER": GOOD["CHAT_OIDC_ISSUER"]}, "CHAT_OIDC_CLIENT_ID"),
        ({"CHAT_OIDC_ISSUER": GOOD["CHAT_OIDC_ISSUER"], "CHAT_OIDC_CLIENT_ID": "chatsite"}, "CHAT_OIDC_CLIENT_SECRET"),
        ({"CHAT_OIDC_CLIENT_ID": "chatsite", "CHAT_OIDC_CLIENT_SECRET": "s"}, "CHAT_OIDC_ISSUER"),
        ({**GOOD, "CHAT_OIDC_SCOPES": "email profile"}, "CHAT_OIDC_SCOPES"),
        ({"CHAT_PASSWORD_LOGIN": "0"}, "CHAT_PASSWORD_LOGIN"),
        ({**GOOD, "CHAT_PASSWORD_LOGIN": "maybe"}, "CHAT_PASSWORD_LOGIN"),
    ],
)
def test_a_bad_configuration_stops_start_up_naming_the_variable(env, named):
    result = start_up(**env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert named in result.stderr.strip().splitlines()[-1]
