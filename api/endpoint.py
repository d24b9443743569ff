"""What every endpoint of the API shares: the caller and its key, the view decorator that
answers every failure as OpenAI's error object, parsing, refusals, and starting a
generation for a client that may leave meanwhile (chat completions, completions and
/v1/responses alike)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponseBase
from django.views.decorators.csrf import csrf_exempt
from pydantic import BaseModel, ValidationError

from accounts.models import ApiKey
from accounts.services import Quota, api_key_authenticate, quota_reported
from api.errors import ApiError, body_too_large, finish, internal_error, request_id_of
from generation import connection_limits
from generation.connection_limits import Held, TooManyConnections
from generation.refusals import REFUSALS, UNREACHABLE, Refusal, refusal_of
from generation.services import Started, generation_cancel, generation_start
from infrastructure import logs
from infrastructure.database import in_database_thread

logger = logging.getLogger(__name__)

View = Callable[..., Coroutine[Any, Any, HttpResponseBase]]
Schema = TypeVar("Schema", bound=BaseModel)


@dataclass
class Caller:
    key: ApiKey
    request_id: str
    quota: Quota | None = None

    @property
    def user(self) -> User:
        return self.key.user


def api_view(*methods: str, public: bool = False) -> Callable[[View], View]:
    """An endpoint of the API: only `methods` (any if none), by API key unless `public`;
    an authenticated view is called with its `Caller` after the request.

    Every refusal and failure is answered as OpenAI's error object: another method is a
    405 with `Allow`; an unexpected exception a 500 whose message names the request id,
    under which the log has the exception and its traceback. Every response gets
    `X-Request-Id` and, once the caller is known, the rate-limit headers.
    """

    def decorate(view: View) -> View:
        @csrf_exempt
        @wraps(view)
        async def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            request_id = request_id_of(request)
            caller: Caller | None = None
            try:
                if methods and request.method not in methods:
                    raise ApiError(405, f"Use {' or '.join(methods)} for {request.path}.", allow=methods)
                if public:
                    response = await view(request, *args, **kwargs)
                else:
                    caller = Caller(key=await in_database_thread(_authenticate, request), request_id=request_id)
                    logs.annotate(user_id=caller.key.user_id, key_prefix=caller.key.prefix)
                    response = await view(request, caller, *args, **kwargs)
            except ApiError as error:
                response = error.response()
            except UNREACHABLE as error:
                response = refused(refusal_of(error)).response()
            except Exception:
                response = internal_error(request, request_id).response()

            if caller is not None:
                try:
                    quota = caller.quota or await in_database_thread(quota_reported, caller.user, api_key=caller.key)
                except UNREACHABLE:  # the counters are in Redis: the response goes without them
                    quota = None
                for name, value in quota.headers().items() if quota else ():
                    response[name] = value
            return finish(response, request_id)

        return wrapper

    return decorate


def _authenticate(request: HttpRequest) -> ApiKey:
    authorization = request.headers.get("Authorization", "")
    scheme, _, token = authorization.partition(" ")
    plain = token.strip() if scheme.lower() == "bearer" else request.headers.get("X-API-Key", "").strip()
    key = api_key_authenticate(plain, request=request) if plain else None
    if key is None:
        raise ApiError(401, "Invalid or missing API key. Send 'Authorization: Bearer <key>'.", code="invalid_api_key")
    return key


def parse(request: HttpRequest, schema: type[Schema]) -> Schema:
    try:
        raw = request.body
    except RequestDataTooBig:
        raise body_too_large(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0) from None
    try:
        return schema.model_validate_json(raw)
    except ValidationError as invalid:
        first = invalid.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        if first["type"] == "json_invalid":
            raise ApiError(400, "The request body is not valid JSON.") from None
        raise ApiError(400, f"{param}: {first['msg']}" if param else first["msg"], param=param) from None


def refused(refusal: Refusal, *, param: str | None = None) -> ApiError:
    return ApiError(refusal.status, refusal.message, code=refusal.code, param=param, retry_after=refusal.retry_after)


def stream_place(caller: Caller) -> Held:
    """A place for one more of the caller's open streams; a 429 when they hold them all."""
    try:
        return connection_limits.streams.hold(caller.key.user_id)
    except TooManyConnections as error:
        raise refused(refusal_of(error)) from None


# Tasks that outlive their request; the loop keeps only weak references to tasks.
_left_running: set[asyncio.Task[None]] = set()


def _keep_until_done(task: asyncio.Task[None]) -> None:
    _left_running.add(task)
    task.add_done_callback(_left_running.discard)


async def _cancel_once_started(start: asyncio.Future[Started], stream_id: str) -> None:
    """Cancel the generation of an admission whose client has gone, once it has started
    (a refused one started nothing)."""
    with contextlib.suppress(Exception):
        await start
        await cancel_quietly(stream_id)


async def start_while_connected(held: Held | None, *, resumable: bool, **fields: Any) -> Started:
    """generation_start(**fields) on a database thread, for a client that may leave meanwhile.

    Django cancels the view when the client disconnects, but not the thread, whose
    generation would then run, and be charged, for no one: it is cancelled once started
    (a resumable stream is left to run, as when its reader leaves later). On a refusal,
    or when the client leaves, the stream's `held` place is given back.
    """
    start = asyncio.ensure_future(in_database_thread(generation_start, **fields))
    try:
        return await asyncio.shield(start)
    except asyncio.CancelledError:
        if not resumable:
            _keep_until_done(asyncio.create_task(_cancel_once_started(start, fields["stream_id"])))
        if held is not None:
            held.release()
        raise
    except REFUSALS:
        if held is not None:
            held.release()
        raise


async def cancel_quietly(stream_id: str) -> None:
    """Cancel a stream's generation as its reader leaves; a failure here (the store is
    unreachable) must not break off the response before it ends, leaving the client waiting."""
    try:
        await cancel(stream_id)
    except Exception:
        logger.warning("Could not cancel the generation of stream %s", stream_id, exc_info=True)


async def cancel(stream_id: str) -> bool:
    # The stream store alone, no database: any thread will do, none of the request's own.
    return await sync_to_async(generation_cancel, thread_sensitive=False)(stream_id=stream_id)
