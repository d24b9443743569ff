"""The enabled policy rules, remembered by each process, without delaying an admin's change.

Every admission looked its rules up in the database: the prompt's and the answer's, each
a query and another for their plans. Each process now remembers the rules it read, under
the *rules version* that was current when it read them. The version is one value in the
site's cache: in Redis when REDIS_URL is set (shared by every web process and worker),
else in this process's memory (a site without Redis is one process). Saving or deleting
a rule (the model's save and delete, the admin's saves of its plans and its bulk delete)
gives it a new value, now and again once the change has committed: every process then
reads the rules afresh at its next admission. An admission costs one cache read.

As in accounts.key_cache, the version is read before the database, so rules read while a
change commits are remembered under the old version and read again next time; a change
made behind the model's back (an `update()` in a shell) is seen within MAX_AGE_S.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from django.core.cache import cache
from django.db import transaction

logger = logging.getLogger(__name__)

VERSION_KEY = "policy-rules:version"
MAX_AGE_S = 60.0

# (rules version, read at, the rules as guardrails.services keeps them)
_remembered: tuple[str, float, Any] | None = None


def rules_version() -> str | None:
    """The current version; None when the cache cannot be read (then read the database)."""
    try:
        version = cache.get(VERSION_KEY)
        if version is None:  # first use, or the cache lost it (a Redis restart): any new value will do
            cache.add(VERSION_KEY, uuid.uuid4().hex, timeout=None)
            version = cache.get(VERSION_KEY)
    except Exception:
        logger.warning("Could not read the policy rules' version; reading the rules", exc_info=True)
        return None
    return None if version is None else str(version)


def policy_rules_changed() -> None:
    """Make every process read the rules afresh: now, and again once the current
    transaction commits (a process may read the old rows meanwhile)."""
    _new_version()
    transaction.on_commit(_new_version)


def _new_version() -> None:
    try:
        cache.set(VERSION_KEY, uuid.uuid4().hex, timeout=None)
    except Exception:  # the others see the change within MAX_AGE_S
        logger.warning("Could not announce a change of the policy rules", exc_info=True)
        forget_rules()


def remembered_rules(version: str | None) -> Any:
    """The rules remembered under `version`; None if there are none (or they are too old)."""
    entry = _remembered
    if version is None or entry is None or entry[0] != version or time.monotonic() - entry[1] > MAX_AGE_S:
        return None
    return entry[2]


def remember_rules(version: str | None, rules: Any) -> None:
    global _remembered
    if version is not None:
        _remembered = (version, time.monotonic(), rules)


def forget_rules() -> None:
    """Forget this process's remembered rules (tests: their database rolls back)."""
    global _remembered
    _remembered = None
