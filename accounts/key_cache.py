"""API keys remembered between requests, without delaying a revocation.

Looking a key up (with its user, account and plan) took a database query on every API
request. Each process now remembers the keys it has seen, each under the *access
version* that was current when it was read from the database. The version is one value
in the site's cache: in Redis when REDIS_URL is set (shared by every web process), else
in this process's memory (a site without Redis is one process). Whatever changes who may
use a key or with what limits (a revocation, a key deleted, a user deactivated, a plan
or an account's limits edited in the admin) gives it a new value once that change has
committed: every process then reads its keys afresh on their next request. A request
costs one cache read (a Redis GET) instead of a database query.

The version is read before the database, so a key read while a revocation commits is
stored under the old version and read again next time. A change made behind the
services' and the admin's backs (an `update()` in a shell) is seen within MAX_AGE_S.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from django.core.cache import cache
from django.db import transaction

if TYPE_CHECKING:
    from accounts.models import ApiKey

VERSION_KEY = "api-access:version"
MAX_AGE_S = 60.0
MAX_KEYS = 10_000  # per process; beyond, it starts again empty

# hashed key -> (access version, read at, the key with its user, account and plan)
_keys: dict[str, tuple[str, float, ApiKey]] = {}


def access_version() -> str:
    version = cache.get(VERSION_KEY)
    if version is None:  # first use, or the cache lost it (a Redis restart): any new value will do
        cache.add(VERSION_KEY, uuid.uuid4().hex, timeout=None)
        version = cache.get(VERSION_KEY)
    return str(version)


def api_access_changed() -> None:
    """Make every process read its API keys afresh: now, and again once the current
    transaction commits (a process may read the old row meanwhile)."""
    _new_version()
    transaction.on_commit(_new_version)


def _new_version() -> None:
    cache.set(VERSION_KEY, uuid.uuid4().hex, timeout=None)


def remembered_key(hashed: str, version: str) -> ApiKey | None:
    entry = _keys.get(hashed)
    if entry is None or entry[0] != version or time.monotonic() - entry[1] > MAX_AGE_S:
        return None
    return entry[2]


def remember_key(hashed: str, version: str, key: ApiKey) -> None:
    if len(_keys) >= MAX_KEYS:
        _keys.clear()
    _keys[hashed] = (version, time.monotonic(), key)


def forget_keys() -> None:
    """Forget this process's remembered keys (tests)."""
    _keys.clear()
