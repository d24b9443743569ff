"""Settings for chatsite, read from the environment (see .env.example and the README)."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import re
import secrets
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import dj_database_url
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be 0 or 1 (got {value!r}).")


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    number = env_optional_int(name, minimum=minimum)
    return default if number is None else number


def env_optional_int(name: str, *, minimum: int = 0) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a whole number (got {value!r}).") from None
    if number < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum} (got {number}).")
    return number


def env_float(name: str, default: float, *, minimum: float = 0.0) -> float:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        number = float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number (got {value!r}).") from None
    if not number > minimum:
        raise ImproperlyConfigured(f"{name} must be greater than {minimum} (got {number}).")
    return number


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = os.environ.get(name, default).strip()
    if value not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)} (got {value!r}).")
    return value


def env_json_list(name: str) -> list[Any]:
    """A JSON list (its entries are checked where they are understood: generation/checks.py)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return []
    try:
        entries = json.loads(raw)
    except ValueError as error:
        raise ImproperlyConfigured(f"{name}: not JSON ({error})") from None
    if not isinstance(entries, list):
        raise ImproperlyConfigured(f"{name}: a JSON list is expected")
    return entries


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def env_origins(name: str) -> list[str]:
    """Comma-separated origins, each scheme://host[:port] with nothing after it; a host may
    start with `*.` for every subdomain (Django's CSRF_TRUSTED_ORIGINS takes that form)."""
    origins = env_list(name, "")
    for origin in origins:
        if not _is_origin(origin):
            raise ImproperlyConfigured(
                f"{name}: {origin!r} is not an origin such as https://chat.example.com or https://*.example.com:8443."
            )
    return origins


def _is_origin(text: str) -> bool:
    parts = urlsplit(text)
    try:
        parts.port  # noqa: B018 (raises ValueError when the port is not a port)
    except ValueError:
        return False
    exact = text == f"{parts.scheme}://{parts.netloc}" and "@" not in parts.netloc
    return parts.scheme in ("http", "https") and bool(parts.hostname) and exact


def env_proxy_ssl_header(name: str) -> tuple[str, str] | None:
    """`Header-Name:value`, the header a proxy sets and its value for HTTPS requests, as
    Django's SECURE_PROXY_SSL_HEADER wants it: ("HTTP_HEADER_NAME", "value")."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    header, _, value = (part.strip() for part in raw.partition(":"))
    if not re.fullmatch(r"[A-Za-z0-9-]+", header) or not value:
        raise ImproperlyConfigured(
            f"{name} must be a header and its HTTPS value, such as X-Forwarded-Proto:https (got {raw!r})."
        )
    return "HTTP_" + header.upper().replace("-", "_"), value


def env_url(name: str) -> str:
    """An http(s) URL with a host and nothing after its path, without a trailing slash; unset: ""."""
    value = os.environ.get(name, "").strip()
    if not value:
        return ""
    parts = urlsplit(value)
    try:
        parts.port  # noqa: B018 (raises ValueError when the port is not a port)
    except ValueError:
        parts = parts._replace(netloc="")
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ImproperlyConfigured(
            f"{name} must be an http or https URL such as https://sso.example.com/realms/staff (got {value!r})."
        )
    return value.rstrip("/")


def env_device(name: str, default: str) -> str:
    value = os.environ.get(name, default).strip()
    index = value.removeprefix("cuda:")
    if value in ("auto", "cpu", "cuda") or (value.startswith("cuda:") and index.isdigit()):
        return value
    raise ImproperlyConfigured(f"{name} must be auto, cpu, cuda or cuda:N (got {value!r}).")


def env_header(name: str) -> str | None:
    """An HTTP header's name, as its request.META key (X-Real-IP: HTTP_X_REAL_IP); unset: None."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    if not re.fullmatch(r"[A-Za-z0-9-]+", value):
        raise ImproperlyConfigured(f"{name} must be an HTTP header's name, such as X-Forwarded-For (got {value!r}).")
    return "HTTP_" + value.upper().replace("-", "_")


def env_ldap_uri(name: str) -> str:
    """One or more LDAP server URIs separated by spaces (libldap tries them in turn), each
    ldap://host[:port] or ldaps://host[:port] with nothing after it; unset: ""."""
    value = " ".join(os.environ.get(name, "").split())
    for uri in value.split():
        parts = urlsplit(uri)
        try:
            parts.port  # noqa: B018 (raises ValueError when the port is not a port)
        except ValueError:
            parts = parts._replace(netloc="")
        if parts.scheme not in ("ldap", "ldaps") or not parts.hostname or parts.path.strip("/") or parts.query:
            raise ImproperlyConfigured(
                f"{name} must be ldap:// or ldaps:// URIs such as ldaps://dc1.example.com (got {uri!r})."
            )
    return value


def _secret_key() -> str:
    """Use DJANGO_SECRET_KEY, else one generated once per checkout into .env.local."""
    if key := os.environ.get("DJANGO_SECRET_KEY"):
        return key
    local = BASE_DIR / ".env.local"
    if local.exists():
        for line in local.read_text().splitlines():
            if line.startswith("DJANGO_SECRET_KEY="):
                return line.partition("=")[2]
    key = secrets.token_urlsafe(50)
    with local.open("a") as file:
        file.write(f"DJANGO_SECRET_KEY={key}\n")
    print(f"warning: DJANGO_SECRET_KEY is not set; generated one into {local}", file=sys.stderr)
    return key


SECRET_KEY = _secret_key()
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")

# HTTPS, directly or behind a proxy (docs/deployment.md: Behind an HTTPS proxy). The defaults serve
# plain HTTP, as `make run` does; `manage.py check --deploy` says what production wants.
# Pages of these other origins may post forms and open the chat's WebSocket.
CSRF_TRUSTED_ORIGINS = env_origins("DJANGO_CSRF_TRUSTED_ORIGINS")
# Trust this header only when a proxy always sets it and nothing reaches daphne past the proxy.
SECURE_PROXY_SSL_HEADER = env_proxy_ssl_header("DJANGO_SECURE_PROXY_SSL_HEADER")
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", False)
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", False)

INSTALLED_APPS = [
    "daphne",
    "twofactor.apps.TwoFactorAdminConfig",  # Django's admin, asking staff with an authenticator for a code
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "axes",
    "csp",
    "django_otp",
    "django_otp.plugins.otp_totp",
    "django_otp.plugins.otp_static",
    "audit",
    "accounts",
    "twofactor",
    "sso",
    "documents",
    "guardrails",
    "tools",
    "generation",
    "api",
    "backups",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "csp.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # request.user.is_verified(): this session has passed a second factor (django-otp).
    "django_otp.middleware.OTPMiddleware",
    # A logged-in user who owes a code is asked for it; one who must have two-factor, to set it up.
    "twofactor.middleware.TwoFactorMiddleware",
    # Notes the session's user before the view: a guest who logs in keeps the chat (accounts.guests).
    "accounts.guests.GuestLoginMiddleware",
    "chatsite.observability.RequestUserMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes asks: it turns a locked-out log-in into the lock-out page.
    "axes.middleware.AxesMiddleware",
]

# Every page loads only this site's own scripts, styles and images, and talks only to it:
# no inline code (chat.js is a static file; base.html's htmx-config keeps htmx from
# injecting its indicator style or evaluating code), no frames, no plugins.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [NONE],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF],
        "connect-src": [SELF],
        "base-uri": [NONE],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

ROOT_URLCONF = "chatsite.urls"
ASGI_APPLICATION = "chatsite.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# The contract's default is sqlite:///db.sqlite3; anchor it to the project so the
# database is the same whichever directory a command runs from.
_DEFAULT_DATABASE_URL = "sqlite:///db.sqlite3"
_database_url = env_str("DATABASE_URL", _DEFAULT_DATABASE_URL)
if _database_url == _DEFAULT_DATABASE_URL:
    _database_url = f"sqlite:///{BASE_DIR / 'db.sqlite3'}"
try:
    # Connections close after each request: the ASGI server runs views in a
    # thread pool, where persistent connections would pile up per thread.
    DATABASES = {"default": dj_database_url.parse(_database_url, conn_max_age=0)}
except ValueError as error:
    raise ImproperlyConfigured(f"DATABASE_URL is not a valid database URL: {error}") from None
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The engine thread writes while requests read: WAL and a busy timeout keep
    # SQLite from answering "database is locked".
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # Tests use a file too: Django's default in-memory test database is shared-cache,
    # whose table locks fail at once ("database table is locked") where WAL would wait.
    # It sits next to the database, so runs with different DATABASE_URLs don't collide.
    database = Path(DATABASES["default"]["NAME"])
    DATABASES["default"]["TEST"] = {"NAME": str(database.with_name(f".test-{database.name}"))}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# The largest request body (Django's default, 2.5 MB): bigger ones are refused before they
# are read (chatsite.body_limit), and the API answers 413 (api.views). The site takes no uploads.
DATA_UPLOAD_MAX_MEMORY_SIZE = 2_621_440

REDIS_URL = env_str("REDIS_URL", "").strip() or None
# Namespace for every Redis key, so that several sites (or test runs) share a server.
REDIS_KEY_PREFIX = env_str("REDIS_KEY_PREFIX", "chatsite").strip() or "chatsite"
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # No socket timeout: redis-py's default (5 s) equals the layer's blocking
            # receive, which then fails now and then instead of returning empty.
            "CONFIG": {
                "hosts": [{"address": REDIS_URL, "socket_timeout": None, "socket_keepalive": True}],
                "prefix": REDIS_KEY_PREFIX,
            },
        }
    }
    CACHES = {
        "default": {
            "BACKEND": "chatsite.cache.RedisCache",  # one connection pool per process
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": REDIS_KEY_PREFIX,
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# open: anyone signs up and is logged in; approval: new accounts wait, inactive, for an
# admin to approve them (the users admin); closed: only admins make accounts.
CHAT_SIGNUP = env_choice("CHAT_SIGNUP", "open", ("open", "approval", "closed"))
# Accounts one client address may make in any 60 seconds (accounts.services.signup_admit).
CHAT_SIGNUPS_PER_MINUTE = env_int("CHAT_SIGNUPS_PER_MINUTE", 3, minimum=1)
# E-mail, for password resets: through this SMTP server when EMAIL_HOST is set; unset,
# nothing is sent and the reset page says that an administrator resets passwords.
EMAIL_HOST = env_str("EMAIL_HOST", "").strip()
EMAIL_PORT = env_int("EMAIL_PORT", 587, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", True)  # STARTTLS on EMAIL_PORT
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)  # TLS from the first byte (port 465)
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ImproperlyConfigured("EMAIL_USE_TLS and EMAIL_USE_SSL cannot both be 1: set EMAIL_USE_TLS=0 for port 465.")
EMAIL_TIMEOUT = 10  # seconds: a slow mail server must not hold a web worker for long
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "chatsite <noreply@localhost>")
CHAT_EMAIL = bool(EMAIL_HOST)
EMAIL_BACKEND = (
    "django.core.mail.backends.smtp.EmailBackend" if CHAT_EMAIL else "django.core.mail.backends.dummy.EmailBackend"
)
# Password-reset e-mails one client address may ask for in any 60 seconds.
PASSWORD_RESETS_PER_MINUTE = 3
PASSWORD_RESET_TIMEOUT = 60 * 60  # a reset link works for an hour
# Budgets (accounts.budgets): calendar days, weeks and months begin at midnight here.
CHAT_BUDGET_TIME_ZONE = env_str("CHAT_BUDGET_TIME_ZONE", "UTC").strip() or "UTC"
try:
    ZoneInfo(CHAT_BUDGET_TIME_ZONE)
except (ValueError, ZoneInfoNotFoundError):
    raise ImproperlyConfigured(
        f"CHAT_BUDGET_TIME_ZONE must be an IANA time zone such as Europe/Paris (got {CHAT_BUDGET_TIME_ZONE!r})."
    ) from None
# Budget alerts (accounts.alerts) go to this Slack-compatible webhook as {"text": ...}, and
# by e-mail to staff and the owner when EMAIL_HOST is set. Unset: no webhook.
CHAT_ALERT_WEBHOOK_URL = env_url("CHAT_ALERT_WEBHOOK_URL")
# on: the log-in page offers "Try it without an account": a guest on the `guest` plan, kept by
# the session cookie, whose limits are shared by every guest of the same client address
# (accounts.services.guest_create). Guests idle for CHAT_GUEST_TTL_DAYS are deleted.
CHAT_GUEST = env_bool("CHAT_GUEST", False)
CHAT_GUEST_TTL_DAYS = env_int("CHAT_GUEST_TTL_DAYS", 7, minimum=1)
# Log-in throttling (django-axes): CHAT_LOGIN_FAILURE_LIMIT wrong passwords for a username
# from one address lock that pair's log-ins for CHAT_LOGIN_LOCKOUT_MINUTES, counted from the
# last failure; while locked, no password is checked. By pair, so that no one can lock a
# user out from elsewhere, nor lock out everyone behind one address (an office, a proxy).
# Admins see and lift lock-outs in the admin (Axes > Access attempts).
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env_int("CHAT_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = dt.timedelta(minutes=env_int("CHAT_LOGIN_LOCKOUT_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
# Attempts while locked neither count nor push the end of the lock-out further away.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_LOCKOUT_CALLABLE = "accounts.views.locked_out"
AXES_CLIENT_IP_CALLABLE = "accounts.client_address.client_ip"
# Two-factor log-in (twofactor app, docs/operations.md: Two-factor): optional per user, required
# per plan (Plan.require_two_factor) and, with CHAT_2FA_STAFF=1, for every staff user.
CHAT_2FA_STAFF = env_bool("CHAT_2FA_STAFF", False)
# The name authenticator apps show next to the user's.
OTP_TOTP_ISSUER = env_str("CHAT_2FA_ISSUER", "chatsite").strip() or "chatsite"
# A wrong code makes the next one wait 1, 2, 4, 8... seconds (django-otp's throttling, per device).
OTP_TOTP_THROTTLE_FACTOR = 1
OTP_STATIC_THROTTLE_FACTOR = 1
# Single sign-on (sso app, docs/operations.md: Single sign-on): OpenID Connect's
# authorization-code flow with PKCE against the provider whose discovery document is at
# <CHAT_OIDC_ISSUER>/.well-known/openid-configuration. The log-in page offers
# "Log in with <CHAT_OIDC_NAME>". CHAT_PASSWORD_LOGIN=0 hides the password form (superusers
# still log in at /admin/, the break-glass way in).
CHAT_OIDC_ISSUER = env_url("CHAT_OIDC_ISSUER")
CHAT_OIDC_CLIENT_ID = env_str("CHAT_OIDC_CLIENT_ID", "").strip()
CHAT_OIDC_CLIENT_SECRET = env_str("CHAT_OIDC_CLIENT_SECRET", "").strip()
CHAT_OIDC_NAME = env_str("CHAT_OIDC_NAME", "single sign-on").strip() or "single sign-on"
CHAT_OIDC_SCOPES = " ".join(env_str("CHAT_OIDC_SCOPES", "openid email profile").split())
CHAT_PASSWORD_LOGIN = env_bool("CHAT_PASSWORD_LOGIN", True)
if CHAT_OIDC_ISSUER and not CHAT_OIDC_CLIENT_ID:
    raise ImproperlyConfigured("CHAT_OIDC_ISSUER needs CHAT_OIDC_CLIENT_ID (the client registered at the provider).")
if CHAT_OIDC_CLIENT_ID and not CHAT_OIDC_CLIENT_SECRET:
    raise ImproperlyConfigured(
        "CHAT_OIDC_CLIENT_ID needs CHAT_OIDC_CLIENT_SECRET (the client's secret at the provider)."
    )
if (CHAT_OIDC_CLIENT_ID or CHAT_OIDC_CLIENT_SECRET) and not CHAT_OIDC_ISSUER:
    raise ImproperlyConfigured("CHAT_OIDC_CLIENT_ID and CHAT_OIDC_CLIENT_SECRET need CHAT_OIDC_ISSUER (the provider).")
if "openid" not in CHAT_OIDC_SCOPES.split():
    raise ImproperlyConfigured(f"CHAT_OIDC_SCOPES must include openid (got {CHAT_OIDC_SCOPES!r}).")
if not CHAT_PASSWORD_LOGIN and not CHAT_OIDC_ISSUER:
    raise ImproperlyConfigured(
        "CHAT_PASSWORD_LOGIN=0 needs CHAT_OIDC_ISSUER: otherwise only /admin/ would take log-ins."
    )
# mozilla-django-oidc's settings; the provider's endpoints come from its discovery document
# (sso.discovery), the ID token is checked by sso.tokens (signature, issuer, audience, expiry, nonce).
OIDC_RP_CLIENT_ID = CHAT_OIDC_CLIENT_ID
OIDC_RP_CLIENT_SECRET = CHAT_OIDC_CLIENT_SECRET
OIDC_RP_SCOPES = CHAT_OIDC_SCOPES
OIDC_RP_SIGN_ALGO = "RS256"
OIDC_USE_NONCE = True
OIDC_USE_PKCE = True
OIDC_TIMEOUT = 10  # seconds for each request to the provider
OIDC_AUTHENTICATION_CALLBACK_URL = "sso:callback"
AUTHENTICATION_BACKENDS.append("sso.backends.OidcBackend")
# LDAP / Active Directory (ldap_login, docs/operations.md: LDAP): set, the log-in form's
# passwords are checked against the directory too, whose users are found under
# CHAT_LDAP_USER_SEARCH_BASE by CHAT_LDAP_USER_FILTER (AD: (sAMAccountName=%(user)s)); the
# ClaimMapping rows of claim ldap_group map the groups under CHAT_LDAP_GROUP_SEARCH_BASE to
# plans and staff status at every log-in. Needs the LDAP extra (requirements-ldap.txt: `make
# ldap`); unset, django_auth_ldap is never imported.
CHAT_LDAP_SERVER_URI = env_ldap_uri("CHAT_LDAP_SERVER_URI")
CHAT_LDAP_BIND_DN = env_str("CHAT_LDAP_BIND_DN", "").strip()
CHAT_LDAP_BIND_PASSWORD = env_str("CHAT_LDAP_BIND_PASSWORD", "")
CHAT_LDAP_USER_SEARCH_BASE = env_str("CHAT_LDAP_USER_SEARCH_BASE", "").strip()
CHAT_LDAP_USER_FILTER = env_str("CHAT_LDAP_USER_FILTER", "(uid=%(user)s)").strip()
CHAT_LDAP_GROUP_SEARCH_BASE = env_str("CHAT_LDAP_GROUP_SEARCH_BASE", "").strip()
CHAT_LDAP_GROUP_TYPE = env_choice("CHAT_LDAP_GROUP_TYPE", "groupOfNames", ("groupOfNames", "posix", "activedirectory"))
CHAT_LDAP_START_TLS = env_bool("CHAT_LDAP_START_TLS", False)
if CHAT_LDAP_SERVER_URI:
    if not CHAT_LDAP_USER_SEARCH_BASE:
        raise ImproperlyConfigured(
            "CHAT_LDAP_SERVER_URI needs CHAT_LDAP_USER_SEARCH_BASE (where the users are: ou=people,dc=example,dc=com)."
        )
    if "%(user)s" not in CHAT_LDAP_USER_FILTER or not re.fullmatch(r"\(.*\)", CHAT_LDAP_USER_FILTER):
        raise ImproperlyConfigured(
            f"CHAT_LDAP_USER_FILTER must be an LDAP filter with %(user)s, such as (uid=%(user)s) "
            f"(got {CHAT_LDAP_USER_FILTER!r})."
        )
    if not CHAT_PASSWORD_LOGIN:
        raise ImproperlyConfigured("CHAT_LDAP_SERVER_URI needs CHAT_PASSWORD_LOGIN=1: directory users use that form.")
    if CHAT_LDAP_START_TLS and CHAT_LDAP_SERVER_URI.startswith("ldaps:"):
        raise ImproperlyConfigured("CHAT_LDAP_START_TLS=1 is for ldap:// URIs: ldaps:// is TLS from the start.")
    if importlib.util.find_spec("django_auth_ldap") is None:
        raise ImproperlyConfigured(
            "CHAT_LDAP_SERVER_URI needs the LDAP extra: `make ldap` (it builds python-ldap, which needs "
            "Debian's libldap2-dev and libsasl2-dev) or pip install --require-hashes -r requirements-ldap.lock."
        )
    # After the axes backend, which counts (and locks out) failed directory log-ins too.
    AUTHENTICATION_BACKENDS.append("ldap_login.backends.LdapBackend")
elif CHAT_LDAP_BIND_DN or CHAT_LDAP_USER_SEARCH_BASE or CHAT_LDAP_GROUP_SEARCH_BASE:
    raise ImproperlyConfigured("CHAT_LDAP_BIND_DN and the CHAT_LDAP_*_SEARCH_BASE settings need CHAT_LDAP_SERVER_URI.")
# The audit trail (audit app) keeps its records this many days; 0: for ever.
CHAT_AUDIT_RETENTION_DAYS = env_int("CHAT_AUDIT_RETENTION_DAYS", 365)
# Where `manage.py backup` writes its archives (docs/operations.md: Backups); relative: to the project.
CHAT_BACKUP_DIR = Path(env_str("CHAT_BACKUP_DIR", "backup-archives"))
if not CHAT_BACKUP_DIR.is_absolute():
    CHAT_BACKUP_DIR = BASE_DIR / CHAT_BACKUP_DIR
# Unset: the client is the connection's peer. Behind a reverse proxy, the header it sets
# (e.g. X-Forwarded-For or X-Real-IP); the proxy must overwrite or append to it.
CHAT_CLIENT_IP_HEADER = env_header("CHAT_CLIENT_IP_HEADER")
# Connections (generation/connection_limits.py, chatsite/daphne_limits.py): event streams
# (browser and API) and chat WebSockets one user may hold open in a web process; messages
# a WebSocket may send (a token bucket: the burst at once, refilled at the rate); seconds
# from a connection's opening (or a kept-alive connection's next byte) to a request's
# complete headers.
CHAT_MAX_STREAMS_PER_USER = env_int("CHAT_MAX_STREAMS_PER_USER", 32, minimum=1)
CHAT_MAX_SOCKETS_PER_USER = env_int("CHAT_MAX_SOCKETS_PER_USER", 16, minimum=1)
CHAT_SOCKET_MESSAGES_PER_S = env_float("CHAT_SOCKET_MESSAGES_PER_S", 20.0)
CHAT_SOCKET_MESSAGE_BURST = env_int("CHAT_SOCKET_MESSAGE_BURST", 40, minimum=1)
CHAT_HEADER_TIMEOUT_S = env_float("CHAT_HEADER_TIMEOUT_S", 10.0)

LOGIN_URL = "accounts:login"
LOGIN_REDIRECT_URL = "generation:chat"
LOGOUT_REDIRECT_URL = "accounts:login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# Where collectstatic writes and WhiteNoise serves from: the checkout's staticfiles/ unless a
# deployment (or a test's live site, which must not serve what another is collecting) says.
STATIC_ROOT = Path(env_str("STATIC_ROOT", "") or BASE_DIR / "staticfiles")
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

# Models and generation (DESIGN.md §3-§5).
CHAT_MODEL = env_str("CHAT_MODEL", "smollm2-135m-instruct").strip()
CHAT_DEVICE = env_device("CHAT_DEVICE", "auto")
CHAT_DTYPE = env_choice("CHAT_DTYPE", "auto", ("auto", "float32", "bfloat16", "float16"))
# Weights quantized at load time: `int8` weight-only by torchao (any device; pays with
# GENERATION_COMPILE on a CPU), `int4` weight-only by torchao (a CPU, in bfloat16), or by
# bitsandbytes (CUDA only: a 7-8B model in 5-10 GB).
CHAT_QUANTIZATION = env_choice("CHAT_QUANTIZATION", "none", ("none", "int8", "int4", "bnb-4bit", "bnb-8bit"))
MODEL_CACHE_DIR = Path(env_str("MODEL_CACHE_DIR", ".cache/models"))
if not MODEL_CACHE_DIR.is_absolute():
    MODEL_CACHE_DIR = BASE_DIR / MODEL_CACHE_DIR
GENERATION_BACKEND = env_choice("GENERATION_BACKEND", "inprocess", ("inprocess", "celery"))
GENERATION_MAX_CONCURRENT = env_optional_int("GENERATION_MAX_CONCURRENT", minimum=1)
GENERATION_MAX_QUEUE = env_int("GENERATION_MAX_QUEUE", 64, minimum=0)
# `batched` shares forward passes between concurrent generations; `sequential` runs one
# generate() call per generation (docs/benchmarks.md compares them).
GENERATION_SCHEDULER = env_choice("GENERATION_SCHEDULER", "batched", ("batched", "sequential"))
# The batched scheduler's static-shape decoding (docs/architecture.md): `auto` on CUDA with
# CUDA graphs, `1` everywhere (eagerly on a CPU), `0` never.
GENERATION_CUDA_GRAPHS = env_choice("GENERATION_CUDA_GRAPHS", "auto", ("auto", "0", "1"))
# Each generation's key/value slot on the static path: prompt plus answer, in tokens.
GENERATION_SLOT_TOKENS = env_int("GENERATION_SLOT_TOKENS", 4096, minimum=16)
# Keys and values of finished generations kept per model, in MiB, so that a prompt that
# begins as an earlier one of the same user did (a chat's next turn, a regenerated answer)
# runs only the rest (docs/deployment.md: Prefix cache). 0: only the chat template's opening.
GENERATION_PREFIX_CACHE_MB = env_int("GENERATION_PREFIX_CACHE_MB", 256, minimum=0)
# With GENERATION_CUDA_GRAPHS=1 on a CPU: compile the static decoding step (torch.compile)
# when the model loads, about 100 s on two cores, for steps 1.3-1.7x faster.
GENERATION_COMPILE = env_bool("GENERATION_COMPILE", False)
# Threads a model on a CPU computes each step with (torch's intra-op threads), in each
# engine; unset: one per core. Fewer leave cores to the web server and other models
# (docs/deployment.md: Threads).
GENERATION_THREADS = env_optional_int("GENERATION_THREADS", minimum=1)
# Seconds with nothing running or waiting after which an engine (a web process's, a
# Celery worker's) frees its model; the next generation loads it again. 0: never.
CHAT_MODEL_IDLE_UNLOAD_S = env_int("CHAT_MODEL_IDLE_UNLOAD_S", 0, minimum=0)
# Models one process (a web process's engines, a Celery worker's) holds in memory at once:
# loading one more first unloads the least recently used idle one not kept warm. 0: no limit.
CHAT_MAX_LOADED_MODELS = env_int("CHAT_MAX_LOADED_MODELS", 0, minimum=0)
# After a conversation's first answer, the model gives it a short title (one small generation).
CHAT_AUTO_TITLE = env_bool("CHAT_AUTO_TITLE", True)
# Tools in the chat (tools/): rounds of tool calls one answer may make before it must answer in text.
CHAT_TOOL_MAX_ROUNDS = env_int("CHAT_TOOL_MAX_ROUNDS", 4, minimum=1)
# A call of a tool set to "Ask every time" waits this long for Approve; then it is not made.
CHAT_TOOL_APPROVAL_TIMEOUT_S = env_int("CHAT_TOOL_APPROVAL_TIMEOUT_S", 300, minimum=1)
# Tool servers configured here as well as in the admin (README: Tools), checked by tools/checks.py.
CHAT_TOOL_SERVERS = env_json_list("CHAT_TOOL_SERVERS")
# Finished answers to deterministic requests (temperature 0 or a seed), streamed again to
# an identical request: `user` serves each user only their own, `global` anyone's.
CHAT_RESPONSE_CACHE = env_choice("CHAT_RESPONSE_CACHE", "user", ("off", "user", "global"))
CHAT_RESPONSE_CACHE_TTL = env_int("CHAT_RESPONSE_CACHE_TTL", 3600, minimum=1)
# Who may open a conversation's share link (/s/<token>/): `users` anyone logged in,
# `public` anyone with the link, `off` nobody (and no Share button).
CHAT_SHARING = env_choice("CHAT_SHARING", "users", ("off", "users", "public"))
CHAT_ENABLE_SYNTHETIC = env_bool("CHAT_ENABLE_SYNTHETIC", False)
CHAT_SYNTHETIC_TOKENS_PER_S = env_float("CHAT_SYNTHETIC_TOKENS_PER_S", 50.0)
# Model servers (vLLM, TGI, Ollama, ...) behind chatsite; more can be added in the admin.
# CHAT_MODEL, CHAT_QUANTIZATION and these are checked against the inference core by
# generation/checks.py, as manage.py and every process start.
CHAT_UPSTREAMS = env_json_list("CHAT_UPSTREAMS")

if GENERATION_BACKEND == "celery" and not REDIS_URL:
    raise ImproperlyConfigured("GENERATION_BACKEND: celery needs REDIS_URL (the broker and the stream store).")

# Celery (docs/scaling.md). Generation tasks go to the `generation` queue, which only
# model workers consume; housekeeping goes to `housekeeping`, consumed next to beat, so
# that a dead model worker is still reaped. With the in-process backend nothing leaves
# the process: tasks run inline, and the web process runs the beat schedule itself.
CELERY_BROKER_URL = REDIS_URL or "memory://"
# The broker's keys (queues included) live under REDIS_KEY_PREFIX like every other key:
# deployments sharing a Redis never take each other's tasks.
CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": f"{REDIS_KEY_PREFIX}:celery:"}
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = GENERATION_BACKEND != "celery"
CELERY_TASK_IGNORE_RESULT = True
# Workers log through LOGGING as the web processes do (JSON lines, request ids).
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_DEFAULT_QUEUE = "housekeeping"
CELERY_TASK_ROUTES = {"generation.generate": {"queue": "generation"}, "generation.title": {"queue": "generation"}}
# Acknowledged when a worker starts a task, and one message at a time per free thread:
# a worker killed mid-generation loses its tasks instead of running them again elsewhere.
CELERY_TASK_ACKS_LATE = False
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Each expires after one period: while no worker consumes them, they don't pile up.
CELERY_BEAT_SCHEDULE = {
    name: {"task": task, "schedule": period_s, "options": {"expires": period_s}}
    for name, task, period_s in (
        ("reap-dead-runs", "generation.reap_dead_runs", 3.0),
        ("usage-rollup", "accounts.usage_rollup", 60.0),
        ("expire-streams", "generation.expire_streams", 300.0),
        ("purge-guests", "accounts.guest_purge", 3600.0),
        ("resend-budget-alerts", "accounts.alert_resend", 300.0),
        ("purge-audit-records", "audit.purge", 3600.0),
    )
}

# One line per record on stderr: JSON (python-json-logger) for log collectors, or text for
# people. Each carries the request's id (infrastructure.logs); tracebacks stay in their line.
# On SIGTERM: seconds for the generations under way to finish before the rest are
# interrupted (their text kept) and the process exits (chatsite/asgi.py, generation/worker.py).
GRACEFUL_TIMEOUT = env_float("GRACEFUL_TIMEOUT", 30.0)
# /metrics and /readyz's details: for a caller with this bearer token, or a local one.
METRICS_TOKEN = env_str("METRICS_TOKEN", "").strip()
# A Celery generation worker's own /metrics port (0: none).
WORKER_METRICS_PORT = env_int("WORKER_METRICS_PORT", 0)
LOG_FORMAT = env_choice("LOG_FORMAT", "json", ("json", "text"))
if LOG_FORMAT == "json":
    # Model loading's progress bars are for terminals; in a JSON log they are noise.
    # Read when huggingface_hub is imported, which settings do not do.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request": {"()": "infrastructure.logs.RequestContext"}},
    "formatters": {
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s %(request_id)s",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
        },
        "text": {
            "()": "infrastructure.logs.TextFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s",
        },
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["request"]}},
    "root": {"handlers": ["console"], "level": "INFO"},
    "loggers": {
        "django": {"level": "INFO"},
        # chatsite.access writes every request once, with its status: Django's own
        # "Not Found: /path" warnings would say it twice.
        "django.request": {"level": "ERROR"},
        # transformers imports torchao (CHAT_QUANTIZATION=int8's and int4's library) whenever a model
        # loads; on a CPU it warns of CUDA kernels and Triton it cannot load, and its enums
        # draw a deprecation warning from torch: noise at every load, with nothing to act on.
        "torchao": {"level": "ERROR"},
        "torch.utils._pytree": {"level": "ERROR"},
    },
}
