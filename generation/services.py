"""Writes and side effects of the chat: conversations, messages, starting generations."""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Literal

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from accounts.models import Account, ApiKey, UsageRecord
from accounts.services import (
    InvalidRequest,
    Quota,
    account_for,
    conversation_admit,
    usage_admit,
    usage_finish_from_cache,
    usage_request_count,
    usage_withdraw,
)
from documents.services import retrieval_for
from generation.backends import runtime
from generation.backends.dispatch import QUEUE_PRODUCER
from generation.backends.jobs import engine_thread_task
from generation.backends.response_cache import (
    CachedAnswer,
    CacheLookup,
    response_cache_lookup,
    response_cache_served,
)
from generation.backends.router import backend
from generation.models import Conversation, Message, ModelFallback
from generation.selectors import MessageTree, chat_history
from guardrails.services import Scope, answer_rules_for, prompt_check, prompt_masked
from inference.backend import GenerationTask, LedgerVerdict
from inference.embedding import available_embedding_models
from inference.engine import EngineOverloaded, GenerationResult, Job
from inference.generators import ContextLengthExceeded, GenerationParams, Prompt, UnfitPrompt, check_prompt
from inference.registry import UnknownModel
from inference.streams import GenerationStatus
from infrastructure import logs
from tools.services import ChatToolRunner, ChatTools, chat_tool_runner, chat_tools_for

logger = logging.getLogger(__name__)

TITLE_LENGTH = 60

ModelKind = Literal["chat", "embedding"]


def models_for(*, user: User, api_key: ApiKey | None = None, kind: ModelKind = "chat") -> list[str]:
    """The served models of `kind` that `user` (through `api_key`, if given) may use, the
    site's default first when allowed. To them no other model exists: every list, form and
    admission asks here. Chat models answer (the default: what forms offer and completions
    take); embedding models make vectors (/v1/embeddings), by the same plan and key rules."""
    account = account_for(user)
    served = backend().models() if kind == "chat" else list(available_embedding_models())
    return [name for name in served if _allowed(account, api_key, name)]


def _allowed(account: Account, api_key: ApiKey | None, model: str) -> bool:
    return account.allows_model(model) and (api_key is None or api_key.allows_model(model))


def models_to_choose(user: User) -> list[str]:
    """The models a form or a copied conversation offers `user`, default first: those they
    may use, or the site's default alone if none (its admission then refuses it)."""
    return models_for(user=user) or backend().models()[:1]


def default_model_for(user: User) -> str:
    return models_to_choose(user)[0]


def conversation_create(*, user: User, model: str | None = None) -> Conversation:
    return Conversation.objects.create(user=user, model=model or default_model_for(user))


def conversation_new(*, user: User) -> Conversation:
    """A conversation not saved yet: its first prompt saves it, once its answer is admitted."""
    return Conversation(user=user, model=default_model_for(user))


# Pins and the archive are saved with update(), not save(): `updated_at`, which orders the
# rest of the sidebar, is left as it was. A conversation is never both: pinning brings one
# back from the archive, archiving unpins it. Setting what is already set keeps its time, so
# a second device that shows a stale button changes nothing.


def conversation_pin(*, conversation: Conversation, pinned: bool) -> None:
    """Pin a conversation to the top of the sidebar (newest pin first), or unpin it."""
    if pinned:
        _organize(conversation, pinned_at=Coalesce("pinned_at", Value(timezone.now())), archived_at=None)
    else:
        _organize(conversation, pinned_at=None)


def conversation_archive(*, conversation: Conversation, archived: bool) -> None:
    """Archive a conversation (it leaves the sidebar, stays open at its URL), or restore it."""
    if archived:
        _organize(conversation, archived_at=Coalesce("archived_at", Value(timezone.now())), pinned_at=None)
    else:
        _organize(conversation, archived_at=None)


def _organize(conversation: Conversation, **changes: Any) -> None:
    Conversation.objects.filter(pk=conversation.pk).update(**changes)
    conversation.refresh_from_db(fields=["pinned_at", "archived_at"])


@dataclass(frozen=True)
class GenerationRequest:
    """What a generation asks, whichever model serves it: admission's inputs, its request
    counted once against the per-minute limit (`requests`: the count it made)."""

    user: User
    account: Account
    channel: str
    prompt: Prompt
    params: GenerationParams
    api_key: ApiKey | None
    stream_id: str
    start_early: bool
    requests: int
    # A chat answer's tool runner: a model that calls tools runs its calls; a fallback that
    # cannot call tools serves the answer without them (_admit_on).
    tools: ChatToolRunner | None = None


@dataclass(frozen=True)
class Admitted:
    """A generation that passed every check, its tokens reserved in the ledger; not queued yet."""

    task: GenerationTask
    producer: str
    quota: Quota
    submitted: bool = False  # started before its admission was written (generation_start)
    # A chat answer from documents: the sources its prompt carries (None: no retrieval stage).
    sources: list[dict[str, Any]] | None = None
    # The response cache's answer to it; None where the cache does not apply.
    cache: CacheLookup | None = None
    prompt_tokens: int = 0
    # The models left to serve it, in order, should its model's queue refuse it (generation_submit).
    fallbacks: tuple[str, ...] = ()
    request: GenerationRequest | None = None

    @property
    def stream_id(self) -> str:
        return self.task.stream_id

    @property
    def model(self) -> str:
        """The model that serves it: the one asked for, or a fallback (ModelFallback)."""
        return self.task.model


@dataclass(frozen=True)
class Started:
    stream_id: str
    max_tokens: int
    quota: Quota
    cache: str | None = None  # "hit" or "miss" where the response cache applies
    model: str = ""  # the model that serves it, a fallback's name where one took it
    # The prompt as the model reads it (masked by the content policy): what to store of it.
    prompt: Prompt = ""


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
    start_early: bool = False,
    tools: ChatToolRunner | None = None,
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

    A model that cannot take it (falls_back) hands it to its fallbacks, in order, those
    the caller may use (model_fallbacks_for): the first that takes it serves it, its
    name in the task and the ledger; when none does, the model's own refusal is raised.
    The request is counted once, whichever model serves it. A chat answer's `tools` (its
    runner; `params.extra["tools"]` their specs) go with it to a fallback that calls tools;
    one that cannot serves the answer without them, rather than no model serving it.

    With `start_early`, where the backend allows it (a model server), the generation is
    submitted before the ledger's transaction and runs while it writes: the first token
    waits for the slower of the two, not for both. A refusal by the ledger then cancels
    it (the server has read a prompt for nothing, at most the per-minute limit's worth),
    and a day's budget that grants fewer tokens than it went out with stops it there.
    """
    runner = backend()
    account = account_for(user)
    # A model the caller may not use is refused exactly as one that does not exist.
    if model not in runner.models() or not _allowed(account, api_key, model):
        if model in available_embedding_models() and _allowed(account, api_key, model):
            message = f"The model {model!r} is an embedding model: it makes vectors at /v1/embeddings, not answers."
            raise InvalidRequest(message, param="model")
        raise UnknownModel(f"The model {model!r} does not exist.")
    if unsupported := sorted(params.extra.keys() - runner.features(model)):
        raise InvalidRequest(f"The model {model!r} does not support {unsupported[0]}.", param=unsupported[0])
    # The content policy, before the request counts: a blocked prompt costs its sender nothing.
    stream_id = stream_id or uuid.uuid4().hex
    prompt = prompt_check(
        user=user, plan=account.plan, channel=channel, model=model, prompt=prompt, stream_id=stream_id
    )
    limits = account.limits
    requests = usage_request_count(user=user, limits=limits, requested_max_tokens=requested_max_tokens, api_key=api_key)
    request = GenerationRequest(
        user=user,
        account=account,
        channel=channel,
        prompt=prompt,
        params=params,
        api_key=api_key,
        stream_id=stream_id or uuid.uuid4().hex,
        start_early=start_early,
        requests=requests,
        tools=tools,
    )
    needed = params.extra.keys() - {"tools"} if tools is not None else params.extra.keys()
    fallbacks = model_fallbacks_for(model=model, account=account, api_key=api_key, features=needed)
    return _admit_first(request, (model, *fallbacks))


def model_fallbacks_for(
    *, model: str, account: Account, api_key: ApiKey | None = None, features: Collection[str] = ()
) -> list[str]:
    """The models that serve a request for `model` when it cannot take it, in the order
    they are tried: its own fallbacks (ModelFallback, by position), then theirs, each model
    once (a chain that comes back to a model it passed does not loop); only those served,
    that take `features` and that the caller may use."""
    runner = backend()
    served = set(runner.models())
    fallbacks: dict[str, list[str]] = {}
    for row in ModelFallback.objects.order_by("position", "pk"):
        fallbacks.setdefault(row.model, []).append(row.fallback)
    chain = [model]
    for name in chain:  # grows as it is read: breadth first, each model once
        for fallback in fallbacks.get(name, []):
            if fallback not in chain:
                chain.append(fallback)
    return [
        name
        for name in chain[1:]
        if name in served and not (set(features) - runner.features(name)) and _allowed(account, api_key, name)
    ]


def falls_back(refusal: Exception) -> bool:
    """Whether a model's refusal hands the request to its fallbacks: the model cannot take
    it now (no endpoint up, its queue full, still loading) or its prompt is beyond the
    model's context. Refusals of the caller (quotas, bad input) are the same on every model."""
    if isinstance(refusal, InvalidRequest):
        return refusal.code == "context_length_exceeded"
    return isinstance(refusal, EngineOverloaded)


def _admit_first(request: GenerationRequest, models: Sequence[str], *, refusal: Exception | None = None) -> Admitted:
    """Admit `request` on the first of `models` that takes it; the others after it are
    its fallbacks still. Raises the first refusal (`refusal`, if given: the one before
    these) when none takes it, or a refusal that does not fall back as it comes."""
    for index, model in enumerate(models):
        try:
            admitted = _admit_on(request, model)
        except (InvalidRequest, EngineOverloaded) as error:
            if not falls_back(error):
                raise
            refusal = refusal or error
            continue
        if refusal is not None:
            logger.info("Fallback %s serves the request (%s)", model, refusal)
        return replace(admitted, fallbacks=tuple(models[index + 1 :]), request=request)
    assert refusal is not None  # models is never empty
    raise refusal


def _admit_on(request: GenerationRequest, model: str) -> Admitted:
    """Admit `request` on `model`: count its prompt, fit it in the context, reserve its
    tokens (generation_admit). Nothing is recorded when it raises."""
    runner = backend()
    user, params, limits = request.user, request.params, request.account.limits
    tools = request.tools
    if tools is not None and "tools" not in runner.features(model):  # a fallback without tools
        params, tools = replace(params, extra={k: v for k, v in params.extra.items() if k != "tools"}), None
    prompt_tokens = runner.count_prompt_tokens(model, request.prompt)
    try:
        room = check_prompt(prompt_tokens, runner.context_length(model))
    except UnfitPrompt as unfit:
        code = "context_length_exceeded" if isinstance(unfit, ContextLengthExceeded) else None
        raise InvalidRequest(str(unfit), param="prompt", code=code) from None
    max_tokens = min(params.max_tokens, room, limits.max_tokens_per_request)
    task = GenerationTask(
        request.stream_id,
        model,
        request.prompt,
        replace(params, max_tokens=max_tokens),
        request_id=logs.request_id(),
        priority=request.account.plan.priority,
        owner=str(user.pk),
        prompt_tokens=prompt_tokens,
        answer_rules=answer_rules_for(scope=Scope(request.account.plan.pk, request.channel, model)),
    )
    logs.annotate(model=model, stream_id=task.stream_id)
    # The one look at the response cache: a hit is admitted like any request, and then
    # streamed from the cache by generation_submit instead of generated.
    cache = response_cache_lookup(
        user_id=user.pk, model=model, prompt=request.prompt, params=task.params, policy=task.answer_rules
    )
    if cache is not None and cache.answer is None:
        task = replace(task, cache_key=cache.key)
    if tools is not None:  # an answer that ran tools is not one to serve again
        task = replace(task, tools=tools, cache_key=None)
    if request.start_early and runner.starts_early(model) and not (cache and cache.answer):
        task = replace(task, admission=LedgerVerdict())
        runner.submit(task)
    producer = runner.producer(model)
    try:
        _, granted, quota = usage_admit(
            user=user,
            limits=limits,
            requests=request.requests,
            channel=request.channel,
            model=model,
            stream_id=task.stream_id,
            producer=producer,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            api_key=request.api_key,
            cache=cache.outcome if cache else "",
        )
    except BaseException:
        if task.admission is not None:
            task.admission.refuse()
            runtime.stream_store().cancel(task.stream_id)
        raise
    if task.admission is not None:
        task.admission.grant(granted)
    if granted < max_tokens:  # cut short by the day's budget: not the answer its key stands for
        task = replace(task, cache_key=None)
    task = replace(task, params=replace(params, max_tokens=granted))
    return Admitted(
        task=task,
        producer=producer,
        quota=quota,
        submitted=task.admission is not None,
        cache=cache,
        prompt_tokens=prompt_tokens,
    )


def generation_submit(admitted: Admitted, *, message_id: int | None = None) -> Started:
    """Queue an admitted generation; the answer `message_id`, if given, is saved as it is written.

    Raises EngineOverloaded when the queue is full; its place in the ledger is then given
    back. Its fallbacks left (Admitted.fallbacks) are admitted and queued in its place
    first: the first that takes it serves it (the answer then names it), and when none
    does, the queue's refusal is raised.
    """
    while True:
        try:
            return _submit(admitted, message_id)
        except EngineOverloaded as refusal:
            if admitted.request is None or not admitted.fallbacks:
                raise
            admitted = _admit_first(admitted.request, admitted.fallbacks, refusal=refusal)
        if message_id is not None:
            Message.objects.filter(pk=message_id).update(model=admitted.model, producer=admitted.producer)


def _submit(admitted: Admitted, message_id: int | None) -> Started:
    task = replace(admitted.task, message_id=message_id)
    if isinstance(task.tools, ChatToolRunner) and message_id is not None:  # each call is saved with the answer
        task = replace(task, tools=replace(task.tools, message_id=message_id))
    cache = admitted.cache
    started = Started(
        stream_id=task.stream_id,
        max_tokens=task.params.max_tokens,
        quota=admitted.quota,
        cache=cache.outcome if cache else None,
        model=task.model,
        prompt=task.prompt,
    )
    if cache is not None and cache.answer is not None:
        _answer_from_cache(task, cache.answer, prompt_tokens=admitted.prompt_tokens)
        response_cache_served(key=cache.key, stream_id=task.stream_id)
        return started
    if admitted.submitted:
        return started
    try:
        backend().submit(task)
    except Exception:
        usage_withdraw(stream_id=task.stream_id)
        raise
    return started


def _answer_from_cache(task: GenerationTask, answer: CachedAnswer, *, prompt_tokens: int) -> None:
    """Stream a cached answer as its generation did: the same token events, then `done`,
    in the stream store, so that readers, resume and Stop work as for any answer. As a
    producer does, the ledger and the answer are saved before the terminal event."""
    began = time.monotonic()
    runtime.stream_store().create(task.stream_id)
    elapsed_ms = round((time.monotonic() - began) * 1000)
    usage_finish_from_cache(
        stream_id=task.stream_id,
        finish_reason=answer.finish_reason,
        ttft_ms=elapsed_ms,
        duration_ms=elapsed_ms,
        answer_tokens=answer.completion_tokens,
    )
    if task.message_id is not None:
        Message.objects.filter(pk=task.message_id).update(
            content=answer.text,
            status=Message.Status.COMPLETE,
            finish_reason=answer.finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=answer.completion_tokens,
            ttft_ms=elapsed_ms,
            from_cache=True,
        )
    result = GenerationResult(
        text=answer.text,
        status=GenerationStatus.COMPLETE,
        finish_reason=answer.finish_reason,
        prompt_tokens=prompt_tokens,
        completion_tokens=0,  # the ledger's figures: a cached answer generates nothing
        ttft_s=elapsed_ms / 1000,
        duration_s=elapsed_ms / 1000,
    )
    events: list[tuple[str, str, dict[str, Any]]] = [(task.stream_id, "token", {"delta": p}) for p in answer.pieces]
    events.append((task.stream_id, "done", {**result.summary(), "cached": True}))
    runtime.stream_store().append_many(events)


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
        start_early=True,
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
    return {stream_id for stream_id, status in statuses.items() if status == UsageRecord.Status.STREAMING}


def message_send(*, conversation: Conversation, prompt: str, channel: str = "ui") -> tuple[Message, Message]:
    """Save the prompt and a streaming answer at the end of the chosen branch, and start
    the answer's generation.

    `conversation` may be new (from conversation_new): it is saved with its first prompt.
    The answer is admitted before anything is saved, so a refusal (QuotaExceeded,
    InvalidRequest) leaves no trace; a full queue (EngineOverloaded) removes what was saved.
    """
    is_new = conversation._state.adding
    if is_new:  # within the plan's conversations (a guest keeps one)
        conversation_admit(user=conversation.user, kept=conversation.user.conversations.count())
    path = MessageTree(conversation).thread()
    history = [*chat_history(conversation, path), {"role": "user", "content": prompt}]
    admitted = _answer_admit(conversation, history, channel=channel)
    prompt = _prompt_stored(conversation, admitted, prompt, channel=channel)
    with transaction.atomic():
        if not conversation.title:
            conversation.title = _first_prompt_title(prompt)
            if not is_new:
                conversation.save(update_fields=["title", "updated_at"])
        if is_new:
            conversation.save()
        parent = path[-1] if path else None
        prompt_message = conversation.messages.create(role=Message.Role.USER, content=prompt, parent=parent)
        answer = _answer_create(conversation, admitted, prompt_message)
    try:
        _answer_submit(answer, admitted)
    except Exception:
        if is_new:
            conversation.delete()
        else:
            prompt_message.delete()
            _leaf_save(conversation, parent)
        raise
    return prompt_message, answer


class CannotRegenerate(ValueError):
    """The answer cannot be regenerated: it is still being written, or answers no prompt."""


def message_regenerate(*, answer: Message, channel: str = "ui") -> Message:
    """Start a new version of `answer`: another answer to the same prompt, which becomes the
    branch shown. `answer` is kept, one click away.

    Raises CannotRegenerate while `answer` is still being written. Refusals are raised as
    by message_send, and then nothing was saved.
    """
    conversation = answer.conversation
    if answer.role != Message.Role.ASSISTANT or answer.parent is None:
        raise CannotRegenerate("Only an answer to a prompt can be regenerated.")
    if answer.streaming:
        raise CannotRegenerate("This answer is still being written; stop it first.")
    prompt = answer.parent
    tree = MessageTree(conversation)
    before = tree.leaf()
    history = chat_history(conversation, tree.path(prompt))
    admitted = _answer_admit(conversation, history, channel=channel)
    with transaction.atomic():
        new_answer = _answer_create(conversation, admitted, prompt)
    try:
        _answer_submit(new_answer, admitted)
    except Exception:
        _leaf_save(conversation, before)
        raise
    return new_answer


def message_edit(*, prompt: Message, content: str, channel: str = "ui") -> tuple[Message, Message]:
    """Ask an edited prompt: a new version of `prompt` with its own answer, which becomes the
    branch shown. `prompt` and everything after it are kept as the other branch.

    Returns the new prompt and its streaming answer. Refusals are raised as by
    message_send, and then nothing was saved.
    """
    conversation = prompt.conversation
    if prompt.role != Message.Role.USER:
        raise ValueError("Only a prompt can be edited.")
    tree = MessageTree(conversation)
    before = tree.leaf()
    earlier = tree.path(prompt.parent)
    history = [*chat_history(conversation, earlier), {"role": "user", "content": content}]
    admitted = _answer_admit(conversation, history, channel=channel)
    content = _prompt_stored(conversation, admitted, content, channel=channel)
    with transaction.atomic():
        edited = Message(conversation=conversation, role=Message.Role.USER, content=content, parent=prompt.parent)
        edited.save(root=True)  # a version of a first prompt has no parent either
        answer = _answer_create(conversation, admitted, edited)
    try:
        _answer_submit(answer, admitted)
    except Exception:
        edited.delete()
        _leaf_save(conversation, before)
        raise
    return edited, answer


def message_choose(*, message: Message) -> Message:
    """Show the branch through `message` (a version picked with ◀ ▶): its newest branch
    below it becomes the conversation's current leaf, for the page and the next prompt.
    Returns that leaf."""
    conversation = message.conversation
    leaf = MessageTree(conversation).newest_leaf(message)
    _leaf_save(conversation, leaf)
    return leaf


def _leaf_save(conversation: Conversation, leaf: Message | None) -> None:
    # update(): choosing a branch neither moves the conversation up the list nor races a
    # concurrent save of its other fields.
    conversation.current_leaf = leaf
    Conversation.objects.filter(pk=conversation.pk).update(current_leaf=leaf)


def _prompt_stored(conversation: Conversation, admitted: Admitted, typed: str, *, channel: str) -> str:
    """What is saved of a typed prompt: masked as the content policy masked it for the
    model (generation_admit), so that the model and every reader see the same text."""
    plan = admitted.request.account.plan if admitted.request is not None else None
    return str(prompt_masked(plan=plan, channel=channel, model=conversation.model, prompt=typed))


def _answer_admit(conversation: Conversation, history: list[dict[str, str]], *, channel: str) -> Admitted:
    """Admit a chat answer; a conversation with documents first retrieves the passages for
    its question, which the prompt carries (and which count towards its tokens)."""
    retrieval = retrieval_for(user=conversation.user, conversation_id=conversation.id, question=history[-1]["content"])
    if retrieval is not None:
        history = [*history[:-1], {"role": "user", "content": retrieval.prompt}]
    params = GenerationParams(max_tokens=conversation.max_tokens, temperature=conversation.temperature)
    tools = _chat_tools(conversation)
    runner = None
    if tools is not None:  # its calls are run here, saved with the answer made next (_submit)
        params = replace(params, extra={"tools": tools.specs})
        runner = chat_tool_runner(tools=tools, message_id=0)
    admitted = generation_admit(
        user=conversation.user,
        channel=channel,
        model=conversation.model,
        prompt=history,
        params=params,
        requested_max_tokens=None,
        tools=runner,
    )
    return admitted if retrieval is None else replace(admitted, sources=retrieval.sources)


def _chat_tools(conversation: Conversation) -> ChatTools | None:
    """The tools the conversation's next answer may call: none on a model that cannot call
    tools (the in-process models), or in a conversation not saved yet."""
    if conversation._state.adding or "tools" not in backend().features(conversation.model):
        return None
    return chat_tools_for(conversation=conversation)


def _answer_create(conversation: Conversation, admitted: Admitted, prompt: Message) -> Message:
    """The streaming answer of an admitted generation to `prompt`, at the end of the branch
    shown; the conversation moves up the list."""
    answer = conversation.messages.create(
        role=Message.Role.ASSISTANT,
        parent=prompt,
        status=Message.Status.STREAMING,
        stream_id=admitted.stream_id,
        model=admitted.model,  # a fallback's, where the conversation's model could not take it
        producer=admitted.producer,
        sources=admitted.sources or [],
    )
    conversation.current_leaf = answer
    conversation.save(update_fields=["current_leaf", "updated_at"])
    return answer


def _answer_submit(answer: Message, admitted: Admitted) -> None:
    """Queue the answer's generation, committed first so that the engine finds the row it
    saves into; if the queue refuses, the answer is removed again."""
    stages = _retrieval_stages_publish(admitted)
    try:
        started = generation_submit(admitted, message_id=answer.pk)
    except Exception:
        if stages:
            # Its stream ends too, so that it expires like any other (append_many: never raises).
            runtime.stream_store().append_many([(admitted.stream_id, "error", {"message": "not started"})])
        answer.delete()  # the conversation's current leaf goes back to its newest message
        raise
    if started.model != answer.model:  # a fallback took it when the model's queue refused it
        answer.refresh_from_db(fields=["model", "producer"])


def _retrieval_stages_publish(admitted: Admitted) -> bool:
    """Open an answer from documents with its stages, before the producer's first event:
    `status` {"state": "retrieving"}, then {"state": "generating", "sources": […]}.

    Retrieval takes milliseconds and ran in the request (its passages are part of the
    prompt the ledger admitted), so both are told together, in order, ahead of the
    engine's own `queued`/`running` statuses and the tokens. Returns whether it told them.
    """
    if admitted.sources is None:
        return False
    store = runtime.stream_store()
    store.create(admitted.stream_id)
    store.append(admitted.stream_id, "status", {"state": "retrieving"})
    store.append(admitted.stream_id, "status", {"state": "generating", "sources": admitted.sources})
    return True


def generation_cancel(*, stream_id: str) -> bool:
    """Stop a generation within one decoding step, wherever it runs; its producer saves
    what it generated. Every Stop, disconnect and force-stop comes through here.

    A flag in the stream store, whichever backend runs it: every producer reads its
    generations' flags (the engine at each decoding step, a worker through Redis, a
    model-server pool every `cancel_poll_s`)."""
    return runtime.stream_store().cancel(stream_id)


def message_stop(*, message: Message) -> bool:
    """Stop a streaming answer; it is saved with the text generated so far, marked stopped."""
    if not message.streaming or not message.stream_id:
        return False
    return generation_cancel(stream_id=message.stream_id)


def _first_prompt_title(prompt: str) -> str:
    """A new conversation's title, and what it keeps when the model's attempt is no title:
    the first prompt's words, as many whole words as fit."""
    title = " ".join(prompt.split())
    if len(title) <= TITLE_LENGTH:
        return title
    cut = title[: TITLE_LENGTH - 1]
    if " " in cut:
        cut = cut.rsplit(" ", 1)[0]  # whole words only
    return cut.rstrip(" ,;:.-") + "…"


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
    if conversation.model not in runtime.model_names():
        return False  # a model server's model: titles are this process's engine's work
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
    # No owner of its own: all titles wait as one owner, so together they take one turn
    # among the users' answers (inference/fair_queue.py).
    job = Job(f"title-{uuid.uuid4().hex}", prompt, TITLE_PARAMS, on_finish=engine_thread_task(save))
    try:
        runtime.local_engine(conversation.model).submit(job)
    except EngineOverloaded:
        return False  # the busy engine's users come first; the title stays as it is
    return True


TITLE_CONTEXT_CHARS = 1000
TITLE_PARAMS = GenerationParams(max_tokens=16, temperature=0.0)


def conversation_save_title(conversation_id: uuid.UUID, replacing: str, result: GenerationResult) -> None:
    """Save a generated title, unless the conversation was renamed meanwhile or the model's
    attempt is no title (then the first prompt's words stay)."""
    # A title that ran into the token limit was cut off mid-phrase.
    finished = result.status == GenerationStatus.COMPLETE and result.finish_reason == "stop"
    title = clean_title(result.text) if finished else ""
    if title:
        # update() leaves updated_at alone: a new title does not move the conversation up.
        Conversation.objects.filter(pk=conversation_id, title=replacing).update(title=title)


TITLE_MAX_WORDS = 8
# What small models answer instead of a title: lead-ins, refusals, placeholders.
_LEAD_IN = re.compile(
    r"^(sure|certainly|of course|okay|ok|here(\s+is|['\u2019]s|\s+are)"
    r"|i(['\u2019]d|['\u2019]ll|['\u2019]m| would| will| can| cannot| can't| am)"
    r"|as an ai|a (good|possible|suitable) title|the title|title suggestions?|suggested title)\b",
    re.IGNORECASE,
)
_LABEL = re.compile(r"^\W*(conversation\s+)?title\s*[:\-\u2013\u2014]\s*", re.IGNORECASE)
_GENERIC_TITLES = frozenset(
    {
        "title",
        "new chat",
        "chat",
        "conversation",
        "a conversation",
        "the conversation",
        "conversation title",
        "untitled",
        "no title",
        "question",
        "questions",
        "help",
        "hello",
        "hi",
        "greeting",
        "greetings",
    }
)
_QUOTES = "\"'`\u2018\u2019\u201c\u201d"
# A title does not end on these: the model was cut off, or wrote a sentence.
_DANGLING = frozenset({"a", "an", "the", "to", "of", "and", "or", "for", "with", "in", "on", "is", "are"})


def clean_title(text: str) -> str:
    """The model's title, tidied (no "Title:" label, quotes, Markdown or full stop), or ""
    when what it wrote is no title: empty, a lead-in or refusal, generic, unfinished, or
    longer than a title (TITLE_MAX_WORDS words, TITLE_LENGTH characters)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # Small models often announce the title ("Here's a title:") on a line of its own.
    line = next((line for line in lines if not line.endswith(":")), "")
    if _LEAD_IN.match(line) and ":" in line:
        line = line.rsplit(":", 1)[1]  # "Sure! Here is a title: Lisbon in May"
    line = _LABEL.sub("", line).strip().strip("*#_ ").strip()
    if line.count('"') % 2 or sum(line.count(quote) for quote in "\u201c\u201d") % 2:
        return ""  # an opened quote never closed: cut off
    line = line.strip(_QUOTES + "*_ ").rstrip(".").strip()
    words = line.split()
    if not words or _LEAD_IN.match(line) or line.lower().rstrip("!?") in _GENERIC_TITLES:
        return ""
    if len(words) > TITLE_MAX_WORDS or len(line) > TITLE_LENGTH or words[-1].lower() in _DANGLING:
        return ""
    if line.endswith((",", ";", ":", "-")):
        return ""
    return line
