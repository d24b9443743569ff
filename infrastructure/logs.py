"""Structured logs: the request context every line carries, one line per request and per generation.

chatsite.asgi.RequestLog opens a context per HTTP request (its id taken from
`X-Request-ID` or made); the views add who asked (`annotate`); the request's line is
written when its response ends. A generation's line is written where it ends (the web
process, or a Celery worker), with the id of the request that started it. Neither ever
holds prompt text, answers, keys or query-string values. The format (JSON or text) is
LOG_FORMAT's, set in settings.LOGGING.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any
from urllib.parse import parse_qsl

from inference.backend import GenerationTask
from inference.engine import GenerationResult

access_log = logging.getLogger("chatsite.access")
generation_log = logging.getLogger("chatsite.generation")

# The fields of the request being served; a dict, so that what a view adds in a worker
# thread (sync_to_async copies the context, not the dict) reaches the request's line.
_request: ContextVar[dict[str, Any] | None] = ContextVar("chatsite_request", default=None)

# The ASGI scope key that marks a request whose context chatsite.observability.RequestLog opened.
REQUEST_LOGGED = "chatsite.request_logged"

# A caller's own id is kept if it is a plain token; anything else is replaced.
_USABLE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def new_request_id(given_id: str | None) -> str:
    """A request's id: the caller's `X-Request-ID` if it is a plain token, else a new one."""
    return given_id if given_id and _USABLE_ID.fullmatch(given_id) else uuid.uuid4().hex


def request_begin(given_id: str | None) -> dict[str, Any]:
    """Open the current request's context with its id (the caller's, if usable)."""
    fields: dict[str, Any] = {"request_id": new_request_id(given_id)}
    _request.set(fields)
    return fields


def request_fields() -> dict[str, Any] | None:
    """The current request's fields, to carry into a thread that runs part of its work."""
    return _request.get()


@contextmanager
def request_context(fields: dict[str, Any] | None) -> Iterator[None]:
    """Run as part of the request whose `fields` these are (request_fields), in any thread."""
    token = _request.set(fields)
    try:
        yield
    finally:
        _request.reset(token)


def request_id() -> str | None:
    fields = _request.get()
    return fields["request_id"] if fields else None


def annotate(**fields: Any) -> None:
    """Add fields (user_id, key_prefix, model, stream_id…) to the current request's line."""
    current = _request.get()
    if current is not None:
        current.update(fields)


def redacted_query(query: str) -> str:
    """The query string's names, every value hidden: a key sent as ?api_key= never reaches a log."""
    return "&".join(f"{name}=***" for name, _ in parse_qsl(query, keep_blank_values=True))


def log_request(fields: dict[str, Any]) -> None:
    access_log.info("%s %s %s", fields.get("method"), fields.get("path"), fields.get("status"), extra=fields)


def log_generation(task: GenerationTask, result: GenerationResult) -> None:
    fields = {
        "request_id": task.request_id,
        "stream_id": task.stream_id,
        "model": task.model,
        "status": result.status,
        "finish_reason": result.finish_reason,
        "error_code": result.error_code,
        "ttft_ms": result.ttft_ms,
        "queue_wait_ms": None if result.queue_wait_s is None else round(result.queue_wait_s * 1000),
        "duration_ms": result.duration_ms,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
    }
    level = logging.WARNING if result.status == "error" else logging.INFO
    generation_log.log(level, "generation %s %s", task.stream_id, result.status, extra=fields)


# Every C0 and C1 control character (DEL included) but none of the printable rest.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _escaped(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


class TextFormatter(logging.Formatter):
    """LOG_FORMAT=text: one record, one line. A newline a client put in a path, a query's
    name or a header would otherwise start a forged line; tracebacks stay in their line too."""

    def format(self, record: logging.LogRecord) -> str:
        return _CONTROL.sub(_escaped, super().format(record))


class RequestContext(logging.Filter):
    """Gives every record the current request's id ("-" outside a request), for both formats."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_id() or "-"
        return True
