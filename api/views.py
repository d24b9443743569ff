"""The OpenAI-compatible API (DESIGN.md §6): chat and text completions, streams, usage.

Plain async Django views. A streamed completion is the same stream-store stream that
the browser reads, formatted as OpenAI chunks; its `id` names the stream, so it can be
resumed (`/v1/streams/<id>`) or cancelled from any process.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from functools import wraps
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from pydantic import ValidationError

from accounts.models import ApiKey, UsageRecord
from accounts.services import Quota, account_for, api_key_authenticate, quota_for
from api.chunks import DONE, Completion, WholeAnswer, completion_events, error_of, openai_finish_reason
from api.openapi import openapi_document
from api.schemas import MAX_TOKENS_MAX, ChatCompletionRequest, CompletionOptions, CompletionRequest
from generation import runtime, sse
from generation.backends import backend
from generation.refusals import REFUSALS, refusal_of
from generation.services import generation_cancel, generation_start
from inference.generators import GenerationParams, Prompt
from inference.streams import StreamNotFound

STREAM_PREFIXES = {"chatcmpl-": "chat", "cmpl-": "text"}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "server_error",
    503: "server_error",
    504: "server_error",
}

View = Callable[..., Coroutine[Any, Any, HttpResponseBase]]


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.retry_after = status, message, code, param, retry_after

    def body(self) -> dict[str, Any]:
        error_type = "insufficient_quota" if self.code == "insufficient_quota" else ERROR_TYPES.get(self.status)
        return {"error": {"message": self.message, "type": error_type, "param": self.param, "code": self.code}}


@dataclass
class Caller:
    key: ApiKey
    request_id: str
    quota: Quota | None = None

    @property
    def user(self) -> User:
        return self.key.user


def api_view(view: View) -> View:
    """Authenticate by API key, and turn every refusal into an OpenAI error object.

    Every response gets `X-Request-Id` and, once the caller is known, the rate-limit headers.
    """

    @csrf_exempt
    @wraps(view)
    async def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        caller: Caller | None = None
        try:
            key = await sync_to_async(_authenticate)(request)
            if key is None:
                raise ApiError(
                    401, "Invalid or missing API key. Send 'Authorization: Bearer <key>'.", code="invalid_api_key"
                )
            caller = Caller(key=key, request_id=request_id)
            response = await view(request, caller, *args, **kwargs)
        except ApiError as error:
            response = JsonResponse(error.body(), status=error.status)
            if error.retry_after is not None:
                response["Retry-After"] = str(error.retry_after)
        response["X-Request-Id"] = request_id
        if caller is not None:
            quota = caller.quota or await sync_to_async(quota_for)(caller.user)
            for name, value in quota.headers().items():
                response[name] = value
        return response

    return wrapper


def _authenticate(request: HttpRequest) -> ApiKey | None:
    authorization = request.headers.get("Authorization", "")
    scheme, _, token = authorization.partition(" ")
    plain = token.strip() if scheme.lower() == "bearer" else request.headers.get("X-API-Key", "").strip()
    return api_key_authenticate(plain) if plain else None


@require_GET
@api_view
async def models_list(request: HttpRequest, caller: Caller) -> HttpResponseBase:
    return JsonResponse(
        {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "chatsite"}
                for name in await sync_to_async(backend().models)()
            ],
        }
    )


@require_POST
@api_view
async def chat_completions(request: HttpRequest, caller: Caller) -> HttpResponseBase:
    body = _parse(request, ChatCompletionRequest)
    assert isinstance(body, ChatCompletionRequest)
    return await _complete(request, caller, body, body.chat(), Completion.new("chat", body.model))


@require_POST
@api_view
async def completions(request: HttpRequest, caller: Caller) -> HttpResponseBase:
    body = _parse(request, CompletionRequest)
    assert isinstance(body, CompletionRequest)
    return await _complete(request, caller, body, body.text(), Completion.new("text", body.model))


@require_GET
@api_view
async def stream_resume(request: HttpRequest, caller: Caller, completion_id: str) -> HttpResponseBase:
    completion = await _owned_completion(caller, completion_id)
    try:
        after = sse.resume_point(request)
    except ValueError:
        raise ApiError(400, sse.RESUME_POINT_ERROR, param="after") from None
    include_usage = request.GET.get("include_usage") in ("1", "true")
    return _sse_response(completion, after=after, include_usage=include_usage, cancel_on_disconnect=False)


@require_POST
@api_view
async def stream_cancel(request: HttpRequest, caller: Caller, completion_id: str) -> HttpResponseBase:
    completion = await _owned_completion(caller, completion_id)
    cancelled = await sync_to_async(generation_cancel)(stream_id=completion.stream_id)
    return JsonResponse({"id": completion.id, "object": "stream.cancellation", "cancelled": cancelled})


@require_GET
@api_view
async def usage(request: HttpRequest, caller: Caller) -> HttpResponseBase:
    account = await sync_to_async(account_for)(caller.user)
    quota = await sync_to_async(quota_for)(caller.user, limits=account.limits)
    caller.quota = quota
    limits = quota.limits
    return JsonResponse(
        {
            "object": "usage",
            "plan": account.plan.name,
            "requests": {
                "per_minute": limits.requests_per_minute,
                "used": limits.requests_per_minute - max(0, quota.requests_remaining),
                "remaining": max(0, quota.requests_remaining),
                "resets_in_s": quota.requests_reset_s,
            },
            "tokens": {
                "per_day": limits.tokens_per_day,
                "used": quota.tokens_used_today,
                "remaining": quota.tokens_remaining,
                "resets_in_s": quota.tokens_reset_s,
            },
            "max_concurrent_streams": limits.max_concurrent_streams,
            "max_tokens_per_request": limits.max_tokens_per_request,
        }
    )


@require_GET
def openapi_json(request: HttpRequest) -> HttpResponseBase:
    return JsonResponse(openapi_document())


@require_GET
def api_docs(request: HttpRequest) -> HttpResponseBase:
    return render(request, "api/docs.html", {"document": openapi_document()})


async def _complete(
    request: HttpRequest, caller: Caller, body: CompletionOptions, prompt: Prompt, completion: Completion
) -> HttpResponseBase:
    requested = body.requested_max_tokens()
    params = GenerationParams(
        # Unset: as long as the plan, the context and the day's budget allow (generation_admit).
        max_tokens=requested or MAX_TOKENS_MAX,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stop=body.stop_sequences(),
        extra=body.passthrough() if isinstance(body, ChatCompletionRequest) else {},
    )
    try:
        started = await sync_to_async(generation_start)(
            user=caller.user,
            channel=UsageRecord.Channel.API,
            model=body.model,
            prompt=prompt,
            params=params,
            requested_max_tokens=requested,
            api_key=caller.key,
            stream_id=completion.stream_id,
        )
    except REFUSALS as error:
        refusal = refusal_of(error)
        # The services call the prompt "prompt"; a chat completion's is its messages.
        param = "messages" if refusal.param == "prompt" and completion.kind == "chat" else refusal.param
        raise ApiError(
            refusal.status, refusal.message, code=refusal.code, param=param, retry_after=refusal.retry_after
        ) from None
    caller.quota = started.quota
    if body.stream:
        return _sse_response(
            completion, after=0, include_usage=body.include_usage, cancel_on_disconnect=not body.resumable
        )
    return await _whole_completion(completion)


async def _whole_completion(completion: Completion) -> HttpResponseBase:
    store = runtime.stream_store()
    answer = WholeAnswer()
    finished = False
    try:
        async for batch in store.read(completion.stream_id):
            for event in batch:  # status events (a wait in the queue) change nothing here
                answer.take(event)
                if event.type == "done":
                    finished = True
                    reason = openai_finish_reason(event.data["finish_reason"])
                    return JsonResponse(completion.whole(answer, reason, event.data["usage"]))
                if event.type == "error":
                    finished = True
                    error = error_of(event.data)
                    raise ApiError(event.data.get("status_code", 500), error["message"], code=error["code"])
        raise ApiError(500, "The generation ended without a result.", code="generation_failed")
    finally:
        if not finished:  # the client went away (or we failed): don't generate for nobody
            await sync_to_async(generation_cancel)(stream_id=completion.stream_id)


def _sse_response(
    completion: Completion, *, after: int, include_usage: bool, cancel_on_disconnect: bool
) -> HttpResponseBase:
    return sse.response(
        _sse_chunks(completion, after=after, include_usage=include_usage, cancel_on_disconnect=cancel_on_disconnect)
    )


async def _sse_chunks(
    completion: Completion, *, after: int, include_usage: bool, cancel_on_disconnect: bool
) -> AsyncIterator[bytes]:
    finished = False
    try:
        if after == 0 and completion.kind == "chat":
            yield sse.event(completion.chunk(role=True, content=""), id=0)
        async for batch in sse.read(runtime.stream_store(), completion.stream_id, after):
            if not batch:
                yield sse.PING
                continue
            finished = batch[-1].terminal
            yield completion_events(completion, batch, include_usage=include_usage)
        finished = True
    except StreamNotFound:
        finished = True
        error = {
            "message": "This stream has expired.",
            "type": "invalid_request_error",
            "param": None,
            "code": "stream_not_found",
        }
        yield sse.event({"error": error}) + DONE
    finally:
        # Django cancels this generator when the client disconnects.
        if not finished and cancel_on_disconnect:
            await sync_to_async(generation_cancel)(stream_id=completion.stream_id)


async def _owned_completion(caller: Caller, completion_id: str) -> Completion:
    kind = next((k for prefix, k in STREAM_PREFIXES.items() if completion_id.startswith(prefix)), None)
    stream_id = completion_id.split("-", 1)[-1]
    record = None
    if kind is not None:
        record = await UsageRecord.objects.filter(
            stream_id=stream_id, user=caller.user, channel=UsageRecord.Channel.API
        ).afirst()
    if record is None:
        raise ApiError(404, f"No stream {completion_id!r}.", code="stream_not_found", param="id")
    return Completion(
        kind=kind or "chat", stream_id=stream_id, model=record.model, created=int(record.created_at.timestamp())
    )


def _parse(request: HttpRequest, schema: type[CompletionOptions]) -> CompletionOptions:
    try:
        raw = request.body
    except RequestDataTooBig:
        raise ApiError(413, "The request body is too large.") from None
    try:
        return schema.model_validate_json(raw)
    except ValidationError as invalid:
        first = invalid.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        if first["type"] == "json_invalid":
            raise ApiError(400, "The request body is not valid JSON.") from None
        raise ApiError(400, f"{param}: {first['msg']}" if param else first["msg"], param=param) from None
