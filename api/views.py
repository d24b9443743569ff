"""The OpenAI-compatible API (DESIGN.md §6): chat and text completions, streams, usage.

Plain async Django views. A streamed completion is the same stream-store stream that
the browser reads, formatted as OpenAI chunks; its `id` names the stream, so it can be
resumed (`/v1/streams/<id>`) or cancelled from any process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, replace
from functools import partial, wraps
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt
from pydantic import BaseModel, ValidationError
from pydantic_core import from_json

from accounts.models import ApiKey, UsageRecord
from accounts.prices import cost_text, recorded_cost
from accounts.services import (
    Quota,
    account_for,
    api_key_authenticate,
    quota_for,
    quota_reported,
    usage_budgets,
    usage_spend_today,
)
from api.chunks import DONE, Completion, WholeAnswer, completion_events, error_of, openai_finish_reason
from api.embeddings import embedding_list
from api.errors import ApiError, body_too_large, finish, internal_error, invalid_url, request_id_of
from api.openapi import openapi_document
from api.schemas import (
    ChatCompletionRequest,
    CompletionOptions,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from generation import connection_limits
from generation.backends import runtime
from generation.connection_limits import Held, TooManyConnections
from generation.embeddings import embeddings_admit, embeddings_make, embeddings_settle, embeddings_withdraw
from generation.refusals import REFUSALS, UNREACHABLE, Refusal, refusal_of
from generation.services import Started, generation_cancel, generation_start, models_for
from generation.tokenizing import ModelTokenizer, tokenizer_for
from inference.generators import Prompt, UnfitPrompt, UnknownTokenId
from inference.streams import StreamNotFound
from infrastructure import logs, sse
from infrastructure.database import in_database_thread

logger = logging.getLogger(__name__)

STREAM_PREFIXES = {"chatcmpl-": "chat", "cmpl-": "text"}
CACHE_HEADER = "x-chatsite-cache"
# A non-streamed answer's cost (DESIGN.md §11), where its model has a price; and its currency.
COST_HEADER = "x-chatsite-cost"
COST_CURRENCY_HEADER = "x-chatsite-cost-currency"

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
                response = _refused(refusal_of(error)).response()
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


@api_view("GET")
async def models_list(request: HttpRequest, caller: Caller) -> HttpResponseBase:
    # OpenAI's model objects, and ours: `kind`, "chat" (completions) or "embedding" (/v1/embeddings).
    chat = await in_database_thread(models_for, user=caller.user, api_key=caller.key)
    embedding = await in_database_thread(models_for, user=caller.user, api_key=caller.key, kind="embedding")
    return JsonResponse(
        {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "chatsite", "kind": kind}
                for kind, names in (("chat", chat), ("embedding", embedding))
                for name in names
            ],
        }
    )


@api_view("POST")
async def embeddings(request: HttpRequest, caller: Caller) -> HttpResponseBase:
    """OpenAI's /v1/embeddings: a unit vector per input text, as floats or base64."""
    body = _parse(request, EmbeddingRequest)
    try:
        admitted = await in_database_thread(
            embeddings_admit,
            user=caller.user,
            model=body.model,
            texts=body.texts(),
            dimensions=body.dimensions,
            api_key=caller.key,
        )
    except REFUSALS as error:
        refusal = refusal_of(error)
        raise _refused(refusal, param=refusal.param) from None
    caller.quota = admitted.quota
    try:
        made = await sync_to_async(embeddings_make, thread_sensitive=False)(admitted)
    except BaseException:
        await in_database_thread(embeddings_withdraw, admitted)
        raise
    await in_database_thread(embeddings_settle, admitted)
    return JsonResponse(embedding_list(made, model=body.model, encoding_format=body.encoding_format))


@api_view("POST")
async def chat_completions(request: HttpRequest, caller: Caller) -> HttpResponseBase:
    body = _parse(request, ChatCompletionRequest)
    assert isinstance(body, ChatCompletionRequest)
    return await _complete(request, caller, body, body.chat(), Completion.new("chat", body.model))


@api_view("POST")
async def completions(request: HttpRequest, caller: Caller) -> HttpResponseBase:
    body = _parse(request, CompletionRequest)
    assert isinstance(body, CompletionRequest)
    return await _complete(request, caller, body, body.text(), Completion.new("text", body.model))


@api_view("GET")
async def stream_resume(request: HttpRequest, caller: Caller, completion_id: str) -> HttpResponseBase:
    completion = await _owned_completion(caller, completion_id)
    try:
        after = sse.resume_point(request)
    except ValueError:
        raise ApiError(400, sse.RESUME_POINT_ERROR, param="after") from None
    include_usage = request.GET.get("include_usage") in ("1", "true")
    return _sse_response(
        request,
        caller,
        completion,
        _stream_place(caller),
        after=after,
        include_usage=include_usage,
        cancel_on_disconnect=False,
    )


@api_view("POST")
async def stream_cancel(request: HttpRequest, caller: Caller, completion_id: str) -> HttpResponseBase:
    completion = await _owned_completion(caller, completion_id)
    cancelled = await _cancel(completion.stream_id)
    return JsonResponse({"id": completion.id, "object": "stream.cancellation", "cancelled": cancelled})


@api_view("GET")
async def usage(request: HttpRequest, caller: Caller) -> HttpResponseBase:
    account = await in_database_thread(account_for, caller.user)
    quota = await in_database_thread(quota_for, caller.user, limits=account.limits)
    spent = await in_database_thread(usage_spend_today, user=caller.user)
    budgets = await in_database_thread(usage_budgets, account=account, api_key=caller.key)
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
            # Today's (UTC) cost of the settled requests, by currency: {} where no model has a price.
            "spend_today": {currency: cost_text(amount) for currency, amount in spent.items()},
            # Every budget that applies to this key's requests (accounts.budgets), tightest first.
            "team": budgets.team,
            "budgets": budgets.budgets,
        }
    )


@api_view("POST")
async def tokenize(request: HttpRequest, caller: Caller) -> HttpResponseBase:
    """vLLM's /tokenize: a prompt's tokens, or a chat's as the model's template renders it."""
    body = _parse(request, _tokenize_form(request))
    model = await _model_tokenizer(caller, body.model)
    try:
        tokens = await sync_to_async(_tokenize_work(body, model), thread_sensitive=False)()
    except UnfitPrompt as unfit:
        raise ApiError(400, str(unfit), param="messages") from None
    answer: dict[str, Any] = {"count": len(tokens), "max_model_len": model.max_model_len, "tokens": tokens}
    if body.return_token_strs:
        answer["token_strs"] = model.tokenizer.token_strings(tokens)
    return JsonResponse(answer)


@api_view("POST")
async def detokenize(request: HttpRequest, caller: Caller) -> HttpResponseBase:
    """vLLM's /detokenize: the text of token ids."""
    body = _parse(request, DetokenizeRequest)
    model = await _model_tokenizer(caller, body.model)
    try:
        prompt = await sync_to_async(model.tokenizer.detokenize, thread_sensitive=False)(body.tokens)
    except UnknownTokenId as unknown:
        raise ApiError(400, str(unknown), param="tokens") from None
    return JsonResponse({"prompt": prompt})


@api_view("GET", public=True)
async def openapi_json(request: HttpRequest) -> HttpResponseBase:
    return JsonResponse(openapi_document())


@api_view("GET", public=True)
async def api_docs(request: HttpRequest) -> HttpResponseBase:
    # Rendered in a thread (the page asks whether its reader is logged in); no database.
    render_docs = sync_to_async(render, thread_sensitive=False)
    response = await render_docs(request, "api/docs.html", {"document": openapi_document()})
    # Swagger UI's stylesheet draws its icons as data: images. django-csp's csp_update does
    # this for sync views; the CSP header's middleware reads it.
    response._csp_update = {"img-src": ["data:"]}  # type: ignore[attr-defined]
    return response


@api_view(public=True)
async def unknown_url(request: HttpRequest) -> HttpResponseBase:
    raise invalid_url(request)


async def _complete(
    request: HttpRequest, caller: Caller, body: CompletionOptions, prompt: Prompt, completion: Completion
) -> HttpResponseBase:
    # Taken before the generation starts: a stream refused its place generates nothing.
    held = _stream_place(caller) if body.stream else None
    try:
        started = await _start_while_connected(
            held,
            resumable=body.resumable,
            user=caller.user,
            channel=UsageRecord.Channel.API,
            model=body.model,
            prompt=prompt,
            params=body.generation_params(),
            requested_max_tokens=body.requested_max_tokens(),
            api_key=caller.key,
            stream_id=completion.stream_id,
        )
    except REFUSALS as error:
        refusal = refusal_of(error)
        # The services call the prompt "prompt"; a chat completion's is its messages.
        param = "messages" if refusal.param == "prompt" and completion.kind == "chat" else refusal.param
        raise _refused(refusal, param=param) from None
    caller.quota = started.quota
    completion = replace(completion, model=started.model)  # a fallback's, where the model could not take it
    if held is not None:
        response = _sse_response(
            request,
            caller,
            completion,
            held,
            after=0,
            include_usage=body.include_usage,
            cancel_on_disconnect=not body.resumable,
        )
    else:
        response = await _whole_completion(completion)
        # Settled before its `done` event was written (the producer saves first): read, not raced.
        if cost := await in_database_thread(recorded_cost, completion.stream_id):
            response[COST_HEADER], response[COST_CURRENCY_HEADER] = cost_text(cost[0]), cost[1]
    if started.cache:  # "hit": streamed from the response cache; "miss": generated, and kept
        response[CACHE_HEADER] = started.cache
    return response


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
            await _cancel_quietly(completion.stream_id)


def _stream_place(caller: Caller) -> Held:
    """A place for one more of the caller's open streams; a 429 when they hold them all."""
    try:
        return connection_limits.streams.hold(caller.key.user_id)
    except TooManyConnections as error:
        raise _refused(refusal_of(error)) from None


def _sse_response(
    request: HttpRequest,
    caller: Caller,
    completion: Completion,
    held: Held,
    *,
    after: int,
    include_usage: bool,
    cancel_on_disconnect: bool,
) -> HttpResponseBase:
    chunks = _sse_chunks(
        request,
        caller,
        completion,
        after=after,
        include_usage=include_usage,
        cancel_on_disconnect=cancel_on_disconnect,
    )
    return sse.response(connection_limits.held_open(held, chunks))


async def _sse_chunks(
    request: HttpRequest,
    caller: Caller,
    completion: Completion,
    *,
    after: int,
    include_usage: bool,
    cancel_on_disconnect: bool,
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
            cost = None
            if include_usage and any(event.type == "done" for event in batch):  # settled by then
                cost = await in_database_thread(recorded_cost, completion.stream_id)
            yield completion_events(completion, batch, include_usage=include_usage, cost=cost)
        finished = True
    except StreamNotFound:
        finished = True
        yield sse.event((await _stream_gone(caller, completion)).body()) + DONE
    except UNREACHABLE as error:
        # The stream store went away mid-stream (a Redis restart): after the headers, the
        # 503 goes out as an event. The producer saves the answer as far as it got.
        logger.warning("Stream %s lost its stream store: %s", completion.stream_id, error)
        yield sse.event(_refused(refusal_of(error)).body()) + DONE
    except Exception:
        # The reading failed otherwise: the error goes out as an event, the log has it.
        yield sse.event(internal_error(request, caller.request_id).body()) + DONE
    finally:
        # Django cancels this generator when the client disconnects.
        if not finished and cancel_on_disconnect:
            await _cancel_quietly(completion.stream_id)


async def _stream_gone(caller: Caller, completion: Completion) -> ApiError:
    """Why the caller's stream is no longer in the store: its answer was interrupted (a crash
    loses an in-memory stream with the process), or it outlived its retention."""
    record = await in_database_thread(
        UsageRecord.objects.filter(stream_id=completion.stream_id, user=caller.user).first
    )
    if record is None or record.status != UsageRecord.Status.INTERRUPTED:
        return ApiError(404, "This stream has expired.", code="stream_not_found")
    # An API answer's text is not kept, only its tokens: counted when the server stopped it
    # gracefully, unknown (0) when the reaper settled it after a crash.
    tokens = record.completion_tokens
    so_far = f" after {tokens} token{'s' if tokens != 1 else ''}" if tokens else ""
    message = f"This answer was interrupted (the server stopped){so_far}; it will not be finished."
    return ApiError(500, message, code="generation_failed")


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
        await _cancel_quietly(stream_id)


async def _start_while_connected(held: Held | None, *, resumable: bool, **fields: Any) -> Started:
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


async def _cancel_quietly(stream_id: str) -> None:
    """Cancel a stream's generation as its reader leaves; a failure here (the store is
    unreachable) must not break off the response before it ends, leaving the client waiting."""
    try:
        await _cancel(stream_id)
    except Exception:
        logger.warning("Could not cancel the generation of stream %s", stream_id, exc_info=True)


async def _cancel(stream_id: str) -> bool:
    # The stream store alone, no database: any thread will do, none of the request's own.
    return await sync_to_async(generation_cancel, thread_sensitive=False)(stream_id=stream_id)


def _refused(refusal: Refusal, *, param: str | None = None) -> ApiError:
    return ApiError(refusal.status, refusal.message, code=refusal.code, param=param, retry_after=refusal.retry_after)


async def _owned_completion(caller: Caller, completion_id: str) -> Completion:
    kind = next((k for prefix, k in STREAM_PREFIXES.items() if completion_id.startswith(prefix)), None)
    stream_id = completion_id.split("-", 1)[-1]
    record = None
    if kind is not None:
        record = await in_database_thread(
            UsageRecord.objects.filter(stream_id=stream_id, user=caller.user, channel=UsageRecord.Channel.API).first
        )
    if record is None:
        raise ApiError(404, f"No stream {completion_id!r}.", code="stream_not_found", param="id")
    return Completion(
        kind=kind or "chat", stream_id=stream_id, model=record.model, created=int(record.created_at.timestamp())
    )


def _tokenize_form(request: HttpRequest) -> type[TokenizeCompletionRequest | TokenizeChatRequest]:
    """The chat form for a body with messages, else the prompt's (whose parsing refuses any other)."""
    try:
        fields = from_json(request.body)
    except (RequestDataTooBig, ValueError):
        return TokenizeCompletionRequest
    return TokenizeChatRequest if isinstance(fields, dict) and "messages" in fields else TokenizeCompletionRequest


async def _model_tokenizer(caller: Caller, model: str) -> ModelTokenizer:
    try:
        return await in_database_thread(tokenizer_for, user=caller.user, model=model, api_key=caller.key)
    except REFUSALS as error:
        refusal = refusal_of(error)
        raise _refused(refusal, param=refusal.param) from None


def _tokenize_work(body: TokenizeCompletionRequest | TokenizeChatRequest, model: ModelTokenizer) -> partial[list[int]]:
    """The tokenizing `body` asks for, to run off the event loop."""
    tokenizer = model.tokenizer
    if isinstance(body, TokenizeCompletionRequest):
        return partial(tokenizer.tokenize, body.prompt, add_special_tokens=body.add_special_tokens)
    if not tokenizer.has_chat_template:
        raise ApiError(400, f"The model {body.model!r} has no chat template: send a prompt.", param="messages")
    return partial(
        tokenizer.tokenize,
        body.chat(),
        add_special_tokens=body.add_special_tokens,
        add_generation_prompt=body.generation_prompt(),
        continue_final_message=body.continue_final_message,
    )


def _parse(request: HttpRequest, schema: type[Schema]) -> Schema:
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
