"""OpenAI's Responses API (POST /v1/responses): the chat-completion machinery, other shapes.

A response's generation is admitted and started exactly as a chat completion's; its stream
store events are then read as the Responses event sequence. With `store` (the default) the
response is kept for its owner, to read back (GET), continue (`previous_response_id`),
cancel or delete; a stored stream resumes with `GET /v1/responses/<id>?stream=true&starting_after=N`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from django.http import HttpRequest, HttpResponseBase, JsonResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from accounts.models import UsageRecord
from api.chunks import status_comment
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
from api.errors import ApiError, internal_error
from api.models import StoredResponse
from api.response_events import (
    ResponseEvents,
    ResponseHead,
    ResponseOutcome,
    outcome_after,
    response_object,
    response_sse,
)
from api.schemas import ResponseCreateRequest
from api.services import stored_response_create, stored_response_delete, stored_response_finish, stored_response_get
from generation import connection_limits
from generation.backends import runtime
from generation.connection_limits import Held
from generation.refusals import REFUSALS, UNREACHABLE, refusal_of
from generation.services import Started
from inference.streams import MAX_SEQUENCE, StreamNotFound
from infrastructure import sse
from infrastructure.database import in_database_thread

logger = logging.getLogger(__name__)

# What the services call a field, and what the Responses API calls it.
PARAMS = {"prompt": "input", "max_tokens": "max_output_tokens"}
# How long a cancel waits for the generation to stop, to answer the response as it ended.
CANCEL_WAIT_S = 5.0


class RetrieveQuery(BaseModel):
    """GET /v1/responses/<id>'s query: the response, or its events after `starting_after`."""

    model_config = ConfigDict(extra="ignore")  # the client's include[] and the like change nothing
    stream: bool = False
    starting_after: int = Field(-1, ge=-1, le=MAX_SEQUENCE)


@api_view("POST")
async def responses_create(request: HttpRequest, caller: Caller) -> HttpResponseBase:
    body = parse(request, ResponseCreateRequest)
    if body.resumable and not body.stored:
        raise ApiError(400, "A background or resumable response needs store: true.", param="store")
    context = await _continued(caller, body.previous_response_id)
    head = ResponseHead(
        stream_id=uuid.uuid4().hex,
        model=body.model,
        created_at=int(time.time()),
        instructions=body.instructions,
        previous_response_id=body.previous_response_id,
        params={
            "temperature": body.temperature,
            "top_p": body.top_p,
            "max_output_tokens": body.max_output_tokens,
            "metadata": body.metadata,
            "background": body.background,
        },
        store=body.stored,
    )
    instructions = [{"role": "system", "content": body.instructions}] if body.instructions else []
    held, started = await _start(caller, body, head, [*instructions, *context, *body.input_messages()])
    # The model is a fallback's where the asked one could not take it; the instructions and
    # the input are kept as the model read them, masked by the content policy, for every reader.
    head = dataclasses.replace(head, model=started.model)
    masked = started.prompt if isinstance(started.prompt, list) else []
    if instructions and masked:
        head = dataclasses.replace(head, instructions=masked[0]["content"])
    if body.stored:
        masked = masked[len(instructions) + len(context) :]
        await in_database_thread(
            stored_response_create, user=caller.user, head=head, context=context, input=masked or body.input_messages()
        )
    if held is not None:
        return _stream(request, caller, head, held, after=-1, cancel_on_disconnect=not body.resumable)
    if body.background:
        return JsonResponse(response_object(head, ResponseOutcome()))
    return JsonResponse(await _whole(head))


@api_view("GET", "DELETE")
async def response_detail(request: HttpRequest, caller: Caller, response_id: str) -> HttpResponseBase:
    if request.method == "DELETE":
        if await in_database_thread(stored_response_delete, user=caller.user, response_id=response_id) is None:
            raise _not_found(response_id)
        return JsonResponse({"id": response_id, "object": "response.deleted", "deleted": True})
    try:
        query = RetrieveQuery.model_validate(request.GET.dict())
    except ValidationError as invalid:
        first = invalid.errors()[0]
        param = ".".join(str(part) for part in first["loc"])
        raise ApiError(400, f"{param}: {first['msg']}", param=param) from None
    stored = await _owned(caller, response_id)
    if not query.stream:
        return JsonResponse(response_object(stored.head(), stored.outcome()))
    held = stream_place(caller)
    return _stream(request, caller, stored.head(), held, after=query.starting_after, cancel_on_disconnect=False)


@api_view("POST")
async def response_cancel(request: HttpRequest, caller: Caller, response_id: str) -> HttpResponseBase:
    stored = await _owned(caller, response_id)
    if stored.status == StoredResponse.Status.IN_PROGRESS:
        await cancel(stored.stream_id)
        await _ended(stored.stream_id)
        stored = await _owned(caller, response_id)
    return JsonResponse(response_object(stored.head(), stored.outcome()))


async def _continued(caller: Caller, previous_response_id: str | None) -> list[dict[str, Any]]:
    """The conversation a response continues: none, or its previous response's, answer included."""
    if previous_response_id is None:
        return []
    previous = await in_database_thread(stored_response_get, user=caller.user, response_id=previous_response_id)
    if previous is None:
        raise ApiError(
            400,
            f"Previous response with id {previous_response_id!r} not found.",
            code="previous_response_not_found",
            param="previous_response_id",
        )
    if previous.status == StoredResponse.Status.IN_PROGRESS:
        raise ApiError(
            400, f"Previous response {previous_response_id!r} is still in progress.", param="previous_response_id"
        )
    return previous.conversation()


async def _start(
    caller: Caller, body: ResponseCreateRequest, head: ResponseHead, messages: list[dict[str, Any]]
) -> tuple[Held | None, Started]:
    """Admit and start the generation, as a chat completion's: a stream's place, if
    streamed, and what started (the model that serves it, the prompt it reads)."""
    held = stream_place(caller) if body.stream else None
    try:
        started = await start_while_connected(
            held,
            resumable=body.resumable,
            user=caller.user,
            channel=UsageRecord.Channel.API,
            model=body.model,
            prompt=messages,
            params=body.generation_params(),
            requested_max_tokens=body.max_output_tokens,
            api_key=caller.key,
            stream_id=head.stream_id,
        )
    except REFUSALS as error:
        refusal = refusal_of(error)
        raise refused(refusal, param=PARAMS.get(refusal.param or "", refusal.param)) from None
    caller.quota = started.quota
    return held, started


async def _whole(head: ResponseHead) -> dict[str, Any]:
    outcome = ResponseOutcome()
    try:
        async for batch in runtime.stream_store().read(head.stream_id):
            for event in batch:
                outcome = outcome_after(outcome, event, created_at=head.created_at)
            if outcome.finished:
                break
    finally:
        if not outcome.finished:  # the client went away (or we failed): don't generate for nobody
            await cancel_quietly(head.stream_id)
    if head.store:
        await in_database_thread(stored_response_finish, response_id=head.id, outcome=outcome)
    if outcome.error is not None:  # as a chat completion's: OpenAI's error object, with its status
        raise ApiError(500, outcome.error["message"], code=outcome.error["code"])
    return response_object(head, outcome)


def _stream(
    request: HttpRequest, caller: Caller, head: ResponseHead, held: Held, *, after: int, cancel_on_disconnect: bool
) -> HttpResponseBase:
    events = _stream_events(request, caller, head, after=after, cancel_on_disconnect=cancel_on_disconnect)
    return sse.response(connection_limits.held_open(held, events))


async def _stream_events(
    request: HttpRequest, caller: Caller, head: ResponseHead, *, after: int, cancel_on_disconnect: bool
) -> AsyncIterator[bytes]:
    """The response's events after sequence number `after`, live until its end.

    Always read from the generation's first event: the numbering is replayed, and only what
    comes after `after` is sent."""
    numbered = ResponseEvents(head)
    finished = False
    try:
        yield response_sse(numbered.opening(), after=after)
        async for batch in sse.read(runtime.stream_store(), head.stream_id, 0):
            if not batch:
                yield sse.PING
                continue
            out: list[bytes] = []
            for event in batch:
                if event.type == "status":
                    out.append(status_comment(event.data))
                else:
                    out.append(response_sse(numbered.take(event), after=after))
            if numbered.outcome.finished and head.store:  # saved before its end goes out
                await in_database_thread(stored_response_finish, response_id=head.id, outcome=numbered.outcome)
            finished = batch[-1].terminal
            yield b"".join(out)
        finished = True
    except StreamNotFound:
        finished = True
        yield response_sse(numbered.fail("stream_not_found", "This response's stream has expired."), after=after)
    except UNREACHABLE as lost:
        logger.warning("Response %s lost its stream store: %s", head.id, lost)
        refusal = refusal_of(lost)
        yield response_sse(numbered.fail(refusal.code or "server_overloaded", refusal.message), after=after)
    except Exception:
        failure = internal_error(request, caller.request_id)
        yield response_sse(numbered.fail("server_error", failure.message), after=after)
    finally:
        # Django cancels this generator when the client disconnects.
        if not finished and cancel_on_disconnect:
            await cancel_quietly(head.stream_id)


async def _ended(stream_id: str) -> None:
    """Wait, a little, for a cancelled generation's last event."""

    async def last() -> None:
        async for batch in runtime.stream_store().read(stream_id):
            if batch and batch[-1].terminal:
                return

    with contextlib.suppress(TimeoutError, StreamNotFound):
        await asyncio.wait_for(last(), CANCEL_WAIT_S)


async def _owned(caller: Caller, response_id: str) -> StoredResponse:
    stored = await in_database_thread(stored_response_get, user=caller.user, response_id=response_id)
    if stored is None:
        raise _not_found(response_id)
    return stored


def _not_found(response_id: str) -> ApiError:
    return ApiError(404, f"Response with id {response_id!r} not found.", code="response_not_found", param="response_id")
