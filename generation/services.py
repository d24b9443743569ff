"""Writes and side effects of the chat: conversations, messages, starting generations."""

from __future__ import annotations

import contextlib
import logging
import re
import uuid
from dataclasses import dataclass, replace
from functools import partial

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q

from accounts.models import ApiKey, UsageRecord
from accounts.services import (
    STREAMING,
    InvalidRequest,
    Quota,
    account_for,
    usage_admit,
    usage_finish,
    usage_request_count,
)
from generation import runtime
from generation.dispatch import QUEUE_PRODUCER
from generation.engine import EngineOverloaded, GenerationResult, Job
from generation.generators import ContextLengthExceeded, GenerationParams, Prompt, UnfitPrompt, check_prompt
from generation.jobs import GenerationTask, engine_thread_task
from generation.models import Conversation, Message
from generation.streams import StreamNotFound, StreamStore

logger = logging.getLogger(__name__)

TITLE_LENGTH = 60
# An answer is included in the model's context only if it has text worth continuing from.
_CONTEXT_STATUSES = (Message.Status.COMPLETE, Message.Status.STOPPED, Message.Status.INTERRUPTED)


def conversation_create(*, user: User, model: str | None = None) -> Conversation:
    return Conversation.objects.create(user=user, model=model or runtime.model_names()[0])


def conversation_new(*, user: User) -> Conversation:
    """A conversation not saved yet: its first prompt saves it, once its answer is admitted."""
    return Conversation(user=user, model=runtime.model_names()[0])


@dataclass(frozen=True)
class Admitted:
    """A generation that passed every check, its tokens reserved in the ledger; not queued yet."""

    task: GenerationTask
    producer: str
    quota: Quota

    @property
    def stream_id(self) -> str:
        return self.task.stream_id


@dataclass(frozen=True)
class Started:
    stream_id: str
    max_tokens: int
    quota: Quota


def generation_admit(
    *,
    user: User,
    channel: str,
    model: str,
    prompt: Prompt,
    params: GenerationParams,
    requested_max_tokens: int | None,
    api_key: ApiKey | None = None,
    stream_id: str | None = None,
) -> Admitted:
    """Check a generation against the user's limits and the model, cheapest check first,
    and reserve its tokens in the ledger.

    The one way every channel (ui, ws, api) admits a generation, so that one ledger holds
    them all. The request is counted against the per-minute limit before its prompt is
    tokenized (once, with the model's tokenizer); a prompt that cannot run (empty, or
    beyond the context) is refused before anything is recorded; the prompt and max_tokens
    (capped by the plan, the context and the day's budget) are reserved together. Raises
    UnknownModel, QuotaExceeded, InvalidRequest or EngineOverloaded (also while the
    model loads); after a refusal nothing is recorded.
    """
    runner = runtime.engine(model)
    limits = account_for(user).limits
    requests = usage_request_count(user=user, limits=limits, requested_max_tokens=requested_max_tokens)
    tokenizer = runner.generator
    if tokenizer is None:
        raise EngineOverloaded(f"the model is not loaded ({runner.load_error or 'loading'})")
    prompt_tokens = tokenizer.count_prompt_tokens(prompt)
    try:
        room = check_prompt(prompt_tokens, tokenizer.context_length)
    except UnfitPrompt as unfit:
        code = "context_length_exceeded" if isinstance(unfit, ContextLengthExceeded) else None
        raise InvalidRequest(str(unfit), param="prompt", code=code) from None
    stream_id = stream_id or uuid.uuid4().hex
    _, granted, quota = usage_admit(
        user=user,
        limits=limits,
        requests=requests,
        channel=channel,
        model=model,
        stream_id=stream_id,
        producer=runner.producer,
        prompt_tokens=prompt_tokens,
        max_tokens=min(params.max_tokens, room, limits.max_tokens_per_request),
        api_key=api_key,
    )
    task = GenerationTask(stream_id, model, prompt, replace(params, max_tokens=granted))
    return Admitted(task=task, producer=runner.producer, quota=quota)


def generation_submit(admitted: Admitted, *, message_id: int | None = None) -> Started:
    """Queue an admitted generation; the answer `message_id`, if given, is saved as it is written.

    Raises EngineOverloaded when the queue is full; its place in the ledger is then given back.
    """
    task = replace(admitted.task, message_id=message_id)
    try:
        runtime.submit(task)
    except Exception:
        UsageRecord.objects.filter(stream_id=task.stream_id).delete()
        raise
    return Started(stream_id=task.stream_id, max_tokens=task.params.max_tokens, quota=admitted.quota)


def generation_start(
    *,
    user: User,
    channel: str,
    model: str,
    prompt: Prompt,
    params: GenerationParams,
    requested_max_tokens: int | None,
    api_key: ApiKey | None = None,
    stream_id: str | None = None,
) -> Started:
    """Admit a generation with nothing of its own to save first (an API completion), and queue it."""
    admitted = generation_admit(
        user=user,
        channel=channel,
        model=model,
        prompt=prompt,
        params=params,
        requested_max_tokens=requested_max_tokens,
        api_key=api_key,
        stream_id=stream_id,
    )
    return generation_submit(admitted)


def generation_claims(*, claims: dict[str, int | None], producer: str) -> set[str]:
    """Record in the ledger that a worker (`producer`) took these queued generations.

    `claims` maps each stream id to its answer's message id (None for the API). The
    worker claims each generation in the stream store first, once (a task delivered
    twice, or one whose stream ended while it waited, generates nothing), and records
    its claims here a moment later, together, while they already generate or after a
    short one has finished. Returns the stream ids still streaming; the others were
    settled meanwhile, or have finished.
    """
    with transaction.atomic():
        taken = UsageRecord.objects.select_for_update().filter(stream_id__in=claims, producer=QUEUE_PRODUCER)
        statuses = dict(taken.values_list("stream_id", "status"))
        UsageRecord.objects.filter(stream_id__in=statuses).update(producer=producer)
        answers = [claims[stream_id] for stream_id in statuses if claims[stream_id] is not None]
        Message.objects.filter(pk__in=answers, producer=QUEUE_PRODUCER).update(producer=producer)
    return {stream_id for stream_id, status in statuses.items() if status == STREAMING}


def message_send(*, conversation: Conversation, prompt: str, channel: str = "ui") -> tuple[Message, Message]:
    """Save the prompt and a streaming answer, and start the answer's generation.

    `conversation` may be new (from conversation_new): it is saved with its first prompt.
    The answer is admitted before anything is saved, so a refusal (QuotaExceeded,
    InvalidRequest) leaves no trace; a full queue (EngineOverloaded) removes what was saved.
    """
    is_new = conversation._state.adding
    history = [*_chat_history(conversation), {"role": "user", "content": prompt}]
    admitted = _answer_admit(conversation, history, channel=channel)
    with transaction.atomic():
        if not conversation.title:
            conversation.title = _first_prompt_title(prompt)
        conversation.save()
        prompt_message = conversation.messages.create(role=Message.Role.USER, content=prompt)
        answer = _answer_create(conversation, admitted)
    try:
        _answer_submit(answer, admitted)
    except Exception:
        if is_new:
            conversation.delete()
        else:
            prompt_message.delete()
        raise
    return prompt_message, answer


class MessageNotLast(ValueError):
    """Only the last prompt of a conversation, and its newest answer, can be redone."""


def message_regenerate(*, answer: Message, channel: str = "ui") -> Message:
    """Start a new answer to the prompt that `answer` answered; `answer` is kept.

    Only the newest, finished answer to the conversation's last prompt can be
    regenerated (MessageNotLast otherwise). Refusals are raised as by message_send,
    and then nothing was saved.
    """
    conversation = answer.conversation
    prompt, newest = _last_exchange(conversation)
    if answer.role != Message.Role.ASSISTANT or prompt is None or newest is None or newest.pk != answer.pk:
        raise MessageNotLast("Only the last answer can be regenerated.")
    if answer.streaming:
        raise MessageNotLast("This answer is still being written; stop it first.")
    admitted = _answer_admit(conversation, _chat_history(conversation, through=prompt), channel=channel)
    with transaction.atomic():
        new_answer = _answer_create(conversation, admitted)
    _answer_submit(new_answer, admitted)
    return new_answer


def message_edit(*, prompt: Message, content: str, channel: str = "ui") -> Message:
    """Replace the text of the last prompt and start a new answer to it.

    Earlier answers stay in the database, as with message_regenerate. Raises
    MessageNotLast for any other message; after a refusal the prompt keeps its text.
    """
    conversation = prompt.conversation
    last_prompt, newest = _last_exchange(conversation)
    if prompt.role != Message.Role.USER or last_prompt is None or last_prompt.pk != prompt.pk:
        raise MessageNotLast("Only your last prompt can be edited.")
    if newest is not None and newest.streaming:
        raise MessageNotLast("The answer to this prompt is still being written; stop it first.")
    history = _chat_history(conversation, through=prompt)
    history[-1] = {"role": "user", "content": content}
    admitted = _answer_admit(conversation, history, channel=channel)
    with transaction.atomic():
        answer = _answer_create(conversation, admitted)
    _answer_submit(answer, admitted)
    prompt.content = content
    prompt.save(update_fields=["content", "updated_at"])
    return answer


def _last_exchange(conversation: Conversation) -> tuple[Message | None, Message | None]:
    """The conversation's last prompt and its newest answer (None where there is none)."""
    prompt = conversation.messages.filter(role=Message.Role.USER).last()
    if prompt is None:
        return None, None
    after = Q(created_at__gt=prompt.created_at) | Q(created_at=prompt.created_at, pk__gt=prompt.pk)
    return prompt, conversation.messages.filter(after, role=Message.Role.ASSISTANT).last()


def _answer_admit(conversation: Conversation, history: list[dict[str, str]], *, channel: str) -> Admitted:
    return generation_admit(
        user=conversation.user,
        channel=channel,
        model=conversation.model,
        prompt=history,
        params=GenerationParams(max_tokens=conversation.max_tokens, temperature=conversation.temperature),
        requested_max_tokens=None,
    )


def _answer_create(conversation: Conversation, admitted: Admitted) -> Message:
    """The streaming answer of an admitted generation; the conversation moves up the list."""
    conversation.save(update_fields=["updated_at"])
    return conversation.messages.create(
        role=Message.Role.ASSISTANT,
        status=Message.Status.STREAMING,
        stream_id=admitted.stream_id,
        model=conversation.model,
        producer=admitted.producer,
    )


def _answer_submit(answer: Message, admitted: Admitted) -> None:
    """Queue the answer's generation, committed first so that the engine finds the row it
    saves into; if the queue refuses, the answer is removed again."""
    try:
        generation_submit(admitted, message_id=answer.pk)
    except Exception:
        answer.delete()
        raise


def message_stop(*, message: Message) -> bool:
    """Ask the producer of a streaming answer to stop; it saves what it generated."""
    if not message.streaming or not message.stream_id:
        return False
    return runtime.stream_store().cancel(message.stream_id)


def message_mark_interrupted(message: Message) -> Message:
    """Settle an answer whose producer is gone: keep its text, mark it interrupted.

    Its stream, if still there, ends with an error event so that readers stop waiting.
    """
    settled = Message.objects.filter(pk=message.pk, status=Message.Status.STREAMING).update(
        status=Message.Status.INTERRUPTED, error="The server stopped while this answer was being written."
    )
    if settled and message.stream_id:
        with contextlib.suppress(StreamNotFound, ValueError):  # gone, or ended meanwhile
            runtime.stream_store().append(
                message.stream_id, "error", {"message": "interrupted", "status": Message.Status.INTERRUPTED}
            )
    message.refresh_from_db()
    return message


def generation_abandon(*, stream_id: str, message_id: int | None) -> bool:
    """Settle as interrupted a queued generation whose stream is gone before a worker took it.

    Its stream expired while it waited, or Redis lost it: nobody reads it any more. Only a
    generation the ledger still has under the queue's name is settled; returns whether it was.
    """
    with transaction.atomic():
        record = (
            UsageRecord.objects.select_for_update()
            .filter(stream_id=stream_id, status=STREAMING, producer=QUEUE_PRODUCER)
            .first()
        )
        if record is None:
            return False
        _usage_interrupted(record)
        if message_id is not None:
            Message.objects.filter(pk=message_id, status=Message.Status.STREAMING).update(
                status=Message.Status.INTERRUPTED, error="The answer waited too long to be written."
            )
    return True


def messages_settle_orphans() -> int:
    """Mark interrupted the generations of producers that no longer beat.

    Their answers keep their saved text; their usage records stop counting as running
    streams (they would otherwise hold the user's concurrent-stream limit forever).
    """
    store = runtime.stream_store()
    messages = list(Message.objects.filter(status=Message.Status.STREAMING).exclude(producer=runtime.PRODUCER))
    settled = 0
    for message, dead in zip(messages, _producers_dead(store, messages), strict=True):
        if dead:
            message_mark_interrupted(message)
            settled += 1
    records = list(UsageRecord.objects.filter(status=Message.Status.STREAMING).exclude(producer=runtime.PRODUCER))
    for record, dead in zip(records, _producers_dead(store, records), strict=True):
        if not dead:
            continue
        _usage_interrupted(record)
        with contextlib.suppress(StreamNotFound, ValueError):
            store.append(record.stream_id, "error", {"message": "interrupted", "status": Message.Status.INTERRUPTED})
    return settled


def _usage_interrupted(record: UsageRecord) -> None:
    """Settle a usage record whose generation will never finish; it no longer holds a stream."""
    usage_finish(
        stream_id=record.stream_id,
        status=Message.Status.INTERRUPTED,
        finish_reason="error",
        prompt_tokens=record.prompt_tokens,
        completion_tokens=0,  # unknown; the user is not charged for a crash
        ttft_ms=None,
        duration_ms=0,
    )


def _producers_dead(store: StreamStore, runs: list[Message] | list[UsageRecord]) -> list[bool]:
    """For each run (with its `producer` and `stream_id`), whether its producer stopped beating.

    A generation the ledger still has under the queue's name may already run on a worker,
    which claimed its stream before recording it in the ledger (worker.generate): that
    worker is the one to ask about, so a worker that dies in between is noticed too.
    """
    queued = [run.stream_id for run in runs if run.producer == QUEUE_PRODUCER and run.stream_id]
    claimed = store.claimants(queued) if queued else {}
    alive: dict[str, bool] = {}
    dead = []
    for run in runs:
        producer = claimed.get(run.stream_id or "", run.producer)
        if producer not in alive:
            alive[producer] = store.producer_alive(producer)
        dead.append(not alive[producer])
    return dead


def runs_reap() -> int:
    """Housekeeping: settle the runs of dead producers, and free their admission places.

    Returns how many answers were settled. An admission place whose generation is no
    longer streaming (its worker died, or queueing it failed) is given back once it is a
    minute old, past any transaction that may still be committing its usage record.
    """
    settled = messages_settle_orphans()
    if settled:
        logger.info("Marked %d answers of stopped processes as interrupted", settled)
    if settings.GENERATION_BACKEND == "celery":
        admission = runtime.admission()
        for model in admission.models():
            admitted = admission.admitted(model, older_than_s=60)
            streaming = set(
                UsageRecord.objects.filter(stream_id__in=admitted, status=STREAMING).values_list("stream_id", flat=True)
            )
            for stream_id in set(admitted) - streaming:
                admission.release(model, stream_id)
    return settled


def _first_prompt_title(prompt: str) -> str:
    """A new conversation's title until the model has given it a better one."""
    return " ".join(prompt.split())[:TITLE_LENGTH]


TITLE_REQUEST = "Write a title of three to six words for this conversation. Reply with the title only."


def conversation_title_start(*, answer_id: int) -> bool:
    """Ask the model to title a conversation after its first exchange (a short generation).

    Only while the conversation still bears the title taken from its first prompt: a
    title the user gave is never replaced. Runs on this process's engine; returns whether
    the generation was queued.
    """
    answer = Message.objects.select_related("conversation").filter(pk=answer_id).first()
    if answer is None or answer.status != Message.Status.COMPLETE:
        return False
    conversation = answer.conversation
    first_prompt = conversation.messages.filter(role=Message.Role.USER).first()
    first_answer = conversation.messages.filter(role=Message.Role.ASSISTANT).first()
    if first_prompt is None or first_answer is None or first_answer.pk != answer.pk:
        return False
    if conversation.title != _first_prompt_title(first_prompt.content):
        return False
    prompt = [
        {"role": "user", "content": first_prompt.content[:TITLE_CONTEXT_CHARS]},
        {"role": "assistant", "content": answer.content[:TITLE_CONTEXT_CHARS]},
        {"role": "user", "content": TITLE_REQUEST},
    ]
    save = partial(conversation_save_title, conversation.pk, conversation.title)
    job = Job(f"title-{uuid.uuid4().hex}", prompt, TITLE_PARAMS, on_finish=engine_thread_task(save))
    try:
        runtime.local_engine(conversation.model).submit(job)
    except EngineOverloaded:
        return False  # the busy engine's users come first; the title stays as it is
    return True


TITLE_CONTEXT_CHARS = 1000
TITLE_PARAMS = GenerationParams(max_tokens=16, temperature=0.0)


def conversation_save_title(conversation_id: uuid.UUID, replacing: str, result: GenerationResult) -> None:
    """Save a generated title, unless the conversation was renamed meanwhile."""
    title = clean_title(result.text) if result.status == "complete" else ""
    if title:
        # update() leaves updated_at alone: a new title does not move the conversation up.
        Conversation.objects.filter(pk=conversation_id, title=replacing).update(title=title)


def clean_title(text: str) -> str:
    """The model's title without a lead-in line, quotes, a "Title:" label or a full stop."""
    lines = [line for line in text.splitlines() if line.strip()]
    # Small models often announce the title ("Here's a title:") on a line of its own.
    line = next((line for line in lines if not line.rstrip().endswith(":")), lines[0] if lines else "")
    line = re.sub(r"^\W*title\s*:\s*", "", line.strip(), flags=re.IGNORECASE)
    line = line.strip().strip("\"'*#` \u2018\u2019\u201c\u201d").rstrip(".")
    return line[:TITLE_LENGTH].strip()


def _chat_history(conversation: Conversation, *, through: Message | None = None) -> list[dict[str, str]]:
    """The conversation as the model sees it: each prompt with only its newest answer.

    Earlier answers to a prompt (kept when it is regenerated or edited) are left out,
    and so is everything after the prompt `through`, when given.
    """
    history = [{"role": "system", "content": conversation.system_prompt}] if conversation.system_prompt else []
    if conversation._state.adding:
        return history
    newest_answer: dict[str, str] | None = None
    rows = conversation.messages.values_list("pk", "role", "content", "status")
    for pk, role, content, status in rows:
        if role == Message.Role.USER:
            if newest_answer:
                history.append(newest_answer)
            newest_answer = None
            history.append({"role": role, "content": content})
            if through is not None and pk == through.pk:
                return history
        else:
            newest_answer = {"role": role, "content": content} if status in _CONTEXT_STATUSES and content else None
    if newest_answer:
        history.append(newest_answer)
    return history
