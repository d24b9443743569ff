"""LDAP log-in's settings: checked at start-up, naming the variable; unset, no LDAP at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from chatsite.settings import env_ldap_uri
from tests.support.livesite import ROOT

GOOD = {
    "CHAT_LDAP_SERVER_URI": "ldap://dc1.example.com",
    "CHAT_LDAP_USER_SEARCH_BASE": "OU=Staff,DC=example,DC=com",
}


def start_up(code: str = "import chatsite.settings", **env: str) -> subprocess.CompletedProcess[str]:
    clean = {name: value for name, value in os.environ.items() if not name.startswith(("CHAT_LDAP_", "CHAT_OIDC_"))}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**clean, "DJANGO_SECRET_KEY": "test", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "good", ["ldap://dc1.example.com", "ldaps://dc1.example.com:636", "ldap://127.0.0.1:3389/", "ldaps://a ldaps://b"]
)
def test_env_ldap_uri_takes_ldap_and_ldaps_uris(monkeypatch, good):
    monkeypatch.setenv("URI", good)
    assert env_ldap_uri("URI") == good


@pytest.mark.parametrize(
    "bad", ["dc1.example.com", "https://dc1.example.com", "ldap://", "ldap://h:port", "ldap://h/dc=example,dc=com"]
)
def test_env_ldap_uri_refuses_what_is_not_a_server_naming_the_variable(monkeypatch, bad):
    monkeypatch.setenv("URI", bad)
    with pytest.raises(ImproperlyConfigured, match="URI"):
        env_ldap_uri("URI")


def test_a_complete_configuration_starts_with_the_ldap_backend_after_the_axes_one():
    started = start_up(
        "import json; from django.conf import settings; print(json.dumps(settings.AUTHENTICATION_BACKENDS))",
        DJANGO_SETTINGS_MODULE="chatsite.settings",
        **GOOD,
    )
    assert started.returncode == 0, started.stderr
    backends = json.loads(started.stdout)
    assert backends[0] == "axes.backends.AxesStandaloneBackend"
    assert backends[-1] == "ldap_login.backends.LdapBackend"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({**GOOD, "CHAT_LDAP_SERVER_URI": "dc1.example.com"}, "CHAT_LDAP_SERVER_URI"),
        ({"CHAT_LDAP_SERVER_URI": GOOD["CHAT_LDAP_SERVER_URI"]}, "CHAT_LDAP_USER_SEARCH_BASE"),
        ({**GOOD, "CHAT_LDAP_USER_FILTER": "(sAMAccountName=ada)"}, "CHAT_LDAP_USER_FILTER"),
        ({**GOOD, "CHAT_LDAP_USER_FILTER": "sAMAccountName=%(user)s"}, "CHAT_LDAP_USER_FILTER"),
        ({**GOOD, "CHAT_LDAP_GROUP_TYPE": "groupOfUniqueNames"}, "CHAT_LDAP_GROUP_TYPE"),
        ({**GOOD, "CHAT_LDAP_START_TLS": "perhaps"}, "CHAT_LDAP_START_TLS"),
        (
            {**GOOD, "CHAT_LDAP_SERVER_URI": "ldaps://dc1.example.com", "CHAT_LDAP_START_TLS": "1"},
            "CHAT_LDAP_START_TLS",
        ),
        ({"CHAT_LDAP_USER_SEARCH_BASE": "ou=people,dc=example,dc=com"}, "CHAT_LDAP_SERVER_URI"),
        (
            {
                **GOOD,
                "CHAT_PASSWORD_LOGIN": "0",
                "CHAT_OIDC_ISSUER": "https://sso.example.com",
                "CHAT_OIDC_CLIENT_ID": "c",
                "CHAT_OIDC_CLIENT_SECRET": "s",
            },
            "CHAT_PASSWORD_LOGIN",
        ),
    ],
)
def test_a_bad_configuration_fails_at_start_up_naming_the_variable(env, named):
    started = start_up(**env)
    assert started.returncode != 0
    assert "ImproperlyConfigured" in started.stderr
    assert named in started.stderr.splitlines()[-1]


def test_a_site_without_the_ldap_extra_is_told_how_to_install_it():
    # sys.modules[name] = None: that package cannot be imported, as where it is not installed.
    started = start_up("import sys; sys.modules['django_auth_ldap'] = None; import chatsite.settings", **GOOD)
    assert started.returncode != 0
    assert "make ldap" in started.stderr.splitlines()[-1]


def test_a_site_without_ldap_never_imports_django_auth_ldap():
    code = (
        "import sys, django; django.setup(); LDAP = ('django_auth_ldap', 'ldap', 'ldap_login');"
        "import chatsite.urls, chatsite.asgi;"
        "from django.contrib.auth import get_backends; get_backends();"
        "print(sorted(name for name in sys.modules if name.partition('.')[0] in LDAP))"
    )
    started = start_up(code, DJANGO_SETTINGS_MODULE="chatsite.settings")
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip().splitlines()[-1] == "[]"
