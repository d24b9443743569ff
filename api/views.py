"""The OpenAI-compatible API (DESIGN.md §6): chat and text completions, streams, usage.

Plain async Django views. A streamed completion is the same stream-store stream that
the browser reads, formatted as OpenAI chunks; its `id` names the stream, so it can be
resumed (`/v1/streams/<id>`) or cancelled from any process.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from functools import partial
from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.shortcuts import render
from pydantic_core import from_json

from accounts.models import UsageRecord
from accounts.prices import cost_text, recorded_cost
from accounts.services import (
    account_for,
    quota_for,
    usage_budgets,
    usage_spend_today,
    usage_tool_calls_today,
)
from api.chunks import DONE, Completion, WholeAnswer, completion_events, error_of, openai_finish_reason
from api.embeddings import embedding_list
from api.endpoint import (
    Caller,
    api_view,
    cancel,
    cancel_quietly,
    parse,
    refused,
    start_while_connected,
    stream_place,
)
from api.errors import ApiError, internal_error, invalid_url
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
from generation.connection_limits import Held
from generation.embeddings import embeddings_admit, embeddings_make, embeddings_settle, embeddings_withdraw
from generation.refusals import REFUSALS, UNREACHABLE, refusal_of
from generation.services import models_for
from generation.tokenizing import ModelTokenizer, tokenizer_for
from inference.generators import Prompt, UnfitPrompt, UnknownTokenId
from inference.streams import StreamNotFound
from infrastructure import sse
from infrastructure.database import in_database_thread

logger = logging.getLogger(__name__)

STREAM_PREFIXES = {"chatcmpl-": "chat", "cmpl-": "text"}
CACHE_HEADER = "x-chatsite-cache"
# A non-streamed answer's cost (DESIGN.md §11), where its model has a price; and its currency.
COST_HEADER = "x-chatsite-cost"
COST_CURRENCY_HEADER = "x-chatsite-cost-currency"


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
    body = parse(request, EmbeddingRequest)
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
        raise refused(refusal, param=refusal.param) from None
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
    body = parse(request, ChatCompletionRequest)
    assert isinstance(body, ChatCompletionRequest)
    return await _complete(request, caller, body, body.chat(), Completion.new("chat", body.model))


@api_view("POST")
async def completions(request: HttpRequest, caller: Caller) -> HttpResponseBase:
    body = parse(request, CompletionRequest)
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
        stream_place(caller),
        after=after,
        include_usage=include_usage,
        cancel_on_disconnect=False,
    )


@api_view("POST")
async def stream_cancel(request: HttpRequest, caller: Caller, completion_id: str) -> HttpResponseBase:
    completion = await _owned_completion(caller, completion_id)
    cancelled = await cancel(completion.stream_id)
    return JsonResponse({"id": completion.id, "object": "stream.cancellation", "cancelled": cancelled})


@api_view("GET")
async def usage(request: HttpRequest, caller: Caller) -> HttpResponseBase:
    account = await in_database_thread(account_for, caller.user)
    quota = await in_database_thread(quota_for, caller.user, limits=account.limits)
    spent = await in_database_thread(usage_spend_today, user=caller.user)
    tool_calls = await in_database_thread(usage_tool_calls_today, user=caller.user)
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
            "tool_calls_today": tool_calls,
            # Every budget that applies to this key's requests (accounts.budgets), tightest first.
            "team": budgets.team,
            "budgets": budgets.budgets,
        }
    )


@api_view("POST")
async def tokenize(request: HttpRequest, caller: Caller) -> HttpResponseBase:
    """vLLM's /tokenize: a prompt's tokens, or a chat's as the model's template renders it."""
    body = parse(request, _tokenize_form(request))
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
    body = parse(request, DetokenizeRequest)
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
    held = stream_place(caller) if body.stream else None
    try:
        started = await start_while_connected(
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
        raise refused(refusal, param=param) from None
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
            await cancel_quietly(completion.stream_id)


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
        yield sse.event(refused(refusal_of(error)).body()) + DONE
    except Exception:
        # The reading failed otherwise: the error goes out as an event, the log has it.
        yield sse.event(internal_error(request, caller.request_id).body()) + DONE
    finally:
        # Django cancels this generator when the client disconnects.
        if not finished and cancel_on_disconnect:
            await cancel_quietly(completion.stream_id)


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
        raise refused(refusal, param=refusal.param) from None


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
