"""The OpenAI-compatible API (DESIGN.md §6): chat and text completions, streams, usage.

Plain async Django views. A streamed completion is the same stream-store stream that
the browser reads, formatted as OpenAI chunks; its `id` names the stream, so it can be
resumed (`/v1/streams/<id>`) or cancelled from any process.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from functools import wraps
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from pydantic import ValidationError

from accounts.models import ApiKey, UsageRecord
from accounts.services import InvalidRequest, Quota, QuotaExceeded, account_for, api_key_authenticate, quota_for
from generation import runtime
from generation.api_schemas import MAX_TOKENS_MAX, ChatCompletionRequest, CompletionOptions, CompletionRequest
from generation.engine import EngineOverloaded
from generation.generators import GenerationParams, Prompt
from generation.openapi import openapi_document
from generation.services import generation_start
from generation.streams import (
    MAX_SEQUENCE,
    StreamEvent,
    StreamNotFound,
    coalesced,
    parse_resume_point,
    sse_event,
)

HEARTBEAT_S = 15.0
BUSY_RETRY_AFTER_S = 5
DONE = b"data: [DONE]\n\n"
STREAM_PREFIXES = {"chatcmpl-": "chat", "cmpl-": "text"}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
    500: "server_error",
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
                {"id": name, "object": "model", "created": 0, "owned_by": "chatsite"} for name in runtime.model_names()
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
    after = _resume_point(request)
    include_usage = request.GET.get("include_usage") in ("1", "true")
    return _sse_response(completion, after=after, include_usage=include_usage, cancel_on_disconnect=False)


@require_POST
@api_view
async def stream_cancel(request: HttpRequest, caller: Caller, completion_id: str) -> HttpResponseBase:
    completion = await _owned_completion(caller, completion_id)
    cancelled = await sync_to_async(runtime.stream_store().cancel)(completion.stream_id)
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
    return render(request, "generation/api_docs.html", {"document": openapi_document()})


# -- completions -------------------------------------------------------------------------


@dataclass(frozen=True)
class Completion:
    """How one generation is presented: chat chunks or text-completion chunks."""

    kind: str  # "chat" | "text"
    stream_id: str
    model: str
    created: int

    @classmethod
    def new(cls, kind: str, model: str) -> Completion:
        return cls(kind=kind, stream_id=uuid.uuid4().hex, model=model, created=int(time.time()))

    @property
    def id(self) -> str:
        return f"{'chatcmpl-' if self.kind == 'chat' else 'cmpl-'}{self.stream_id}"

    def chunk(
        self, *, content: str | None = None, role: bool = False, finish_reason: str | None = None
    ) -> dict[str, Any]:
        if self.kind == "chat":
            delta: dict[str, str] = {"role": "assistant"} if role else {}
            if content is not None:
                delta["content"] = content
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish_reason}
            return self._envelope("chat.completion.chunk", [choice])
        return self._envelope(
            "text_completion", [{"index": 0, "text": content or "", "finish_reason": finish_reason, "logprobs": None}]
        )

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        return {
            **self._envelope("chat.completion.chunk" if self.kind == "chat" else "text_completion", []),
            "usage": usage,
        }

    def whole(self, text: str, finish_reason: str, usage: dict[str, int]) -> dict[str, Any]:
        if self.kind == "chat":
            message = {"role": "assistant", "content": text, "refusal": None}
            choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
            return {**self._envelope("chat.completion", [choice]), "usage": usage}
        choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
        return {**self._envelope("text_completion", [choice]), "usage": usage}

    def _envelope(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}


def openai_finish_reason(finish_reason: str) -> str:
    # OpenAI knows stop and length; a cancelled generation stopped where it was asked to.
    return "length" if finish_reason == "length" else "stop"


def comment_line(text: str) -> bytes:
    """An SSE comment line, with no blank line after it.

    A blank line ends an event. After a comment it ends one with no data, which the
    spec says to drop, but the openai Python client dispatches it once the stream has
    sent an `id:` and then fails to parse its empty data (openai/openai-python#2722).
    """
    return f": {text}\n".encode()


def status_comment(data: dict[str, Any]) -> bytes:
    """A wait in the queue as a comment line: people reading the raw stream see it, clients skip it."""
    if data.get("state") == "queued":
        return comment_line(f"queued, {data['ahead']} ahead")
    return comment_line(str(data.get("state", "status")))


def completion_events(completion: Completion, events: list[StreamEvent], *, include_usage: bool) -> bytes:
    """Format a batch of stream events as OpenAI SSE chunks; consecutive tokens coalesce.

    `status` events become comment lines: OpenAI clients must see no chunk they don't know.
    """
    out: list[bytes] = []
    for event in coalesced(events):
        if event.type == "status":
            out.append(status_comment(event.data))
        elif event.type == "token":
            out.append(sse_event(completion.chunk(content=event.data["delta"]), id=event.seq))
        elif event.type == "done":
            reason = openai_finish_reason(event.data["finish_reason"])
            out.append(sse_event(completion.chunk(finish_reason=reason), id=event.seq))
            if include_usage:
                out.append(sse_event(completion.usage_chunk(event.data["usage"]), id=event.seq))
            out.append(DONE)
        elif event.type == "error":
            error = {
                "message": event.data.get("message", "Generation failed."),
                "type": "server_error",
                "param": None,
                "code": "generation_failed",
            }
            out.append(sse_event({"error": error}, id=event.seq))
            out.append(DONE)
    return b"".join(out)


async def _complete(
    request: HttpRequest, caller: Caller, body: CompletionOptions, prompt: Prompt, completion: Completion
) -> HttpResponseBase:
    if body.model not in runtime.model_names():
        raise ApiError(404, f"The model {body.model!r} does not exist.", code="model_not_found", param="model")
    requested = body.requested_max_tokens()
    params = GenerationParams(
        # Unset: as long as the plan, the context and the day's budget allow (generation_admit).
        max_tokens=requested or MAX_TOKENS_MAX,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stop=body.stop_sequences(),
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
    except QuotaExceeded as refusal:
        raise ApiError(
            429, refusal.message, code=refusal.code, param=refusal.param, retry_after=refusal.retry_after
        ) from None
    except InvalidRequest as invalid:
        # The service calls the prompt "prompt"; a chat completion's is its messages.
        param = "messages" if invalid.param == "prompt" and completion.kind == "chat" else invalid.param
        raise ApiError(400, invalid.message, code=invalid.code, param=param) from None
    except EngineOverloaded:
        raise ApiError(
            503,
            "The server is overloaded; try again shortly.",
            code="server_overloaded",
            retry_after=BUSY_RETRY_AFTER_S,
        ) from None
    caller.quota = started.quota
    if body.stream:
        return _sse_response(
            completion, after=0, include_usage=body.include_usage, cancel_on_disconnect=not body.resumable
        )
    return await _whole_completion(completion)


async def _whole_completion(completion: Completion) -> HttpResponseBase:
    store = runtime.stream_store()
    pieces: list[str] = []
    finished = False
    try:
        async for batch in store.read(completion.stream_id):
            for event in batch:  # status events (a wait in the queue) change nothing here
                if event.type == "token":
                    pieces.append(event.data["delta"])
                elif event.type == "done":
                    finished = True
                    reason = openai_finish_reason(event.data["finish_reason"])
                    return JsonResponse(completion.whole("".join(pieces), reason, event.data["usage"]))
                elif event.type == "error":
                    finished = True
                    raise ApiError(500, event.data.get("message", "Generation failed."), code="generation_failed")
        raise ApiError(500, "The generation ended without a result.", code="generation_failed")
    finally:
        if not finished:  # the client went away (or we failed): don't generate for nobody
            await sync_to_async(store.cancel)(completion.stream_id)


def _sse_response(
    completion: Completion, *, after: int, include_usage: bool, cancel_on_disconnect: bool
) -> HttpResponseBase:
    response = StreamingHttpResponse(
        _sse_chunks(completion, after=after, include_usage=include_usage, cancel_on_disconnect=cancel_on_disconnect),
        content_type="text/event-stream; charset=utf-8",
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


async def _sse_chunks(
    completion: Completion, *, after: int, include_usage: bool, cancel_on_disconnect: bool
) -> AsyncIterator[bytes]:
    store = runtime.stream_store()
    finished = False
    try:
        if after == 0 and completion.kind == "chat":
            yield sse_event(completion.chunk(role=True, content=""), id=0)
        async for batch in store.read(completion.stream_id, after, heartbeat_s=HEARTBEAT_S):
            if not batch:
                yield comment_line("ping")
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
        yield sse_event({"error": error}) + DONE
    finally:
        # Django cancels this generator when the client disconnects.
        if not finished and cancel_on_disconnect:
            await sync_to_async(store.cancel)(completion.stream_id)


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


def _resume_point(request: HttpRequest) -> int:
    raw = request.GET.get("after") or request.headers.get("Last-Event-ID") or "0"
    try:
        return parse_resume_point(raw)
    except ValueError:
        raise ApiError(
            400, f"Last-Event-ID and ?after= must be an integer from 0 to {MAX_SEQUENCE}.", param="after"
        ) from None


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
