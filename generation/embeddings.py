"""Embeddings for the API (/v1/embeddings): the same keys, model access, quotas and ledger
as generations.

An embedding request is admitted as a generation is (generation.services.generation_admit):
the model must be one the caller may use (models_for, kind "embedding"); the request is
counted against the per-minute limit before its inputs are tokenized; its tokens are the
prompt's, reserved in the day's budget with no answer tokens (usage_admit, max_tokens 0),
and settled once the vectors are made. While they are made its usage record streams, so
it counts as one of the caller's concurrent streams, as a generation does. An input
beyond the model's max_tokens is refused (400 context_length_exceeded), as OpenAI does,
before anything is recorded.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.models import User

from accounts.models import ApiKey, UsageRecord
from accounts.services import (
    InvalidRequest,
    Quota,
    account_for,
    usage_admit,
    usage_finish,
    usage_request_count,
    usage_withdraw,
)
from generation.backends import runtime
from generation.services import models_for
from inference.embedding import Embedder, Embeddings, InputTooLong, embedder_for
from inference.registry import UnknownModel


@dataclass(frozen=True)
class EmbeddingsAdmitted:
    """An embedding request that passed every check, its tokens recorded; vectors not made yet."""

    embedder: Embedder
    token_ids: list[list[int]]
    stream_id: str
    quota: Quota
    started: float

    @property
    def prompt_tokens(self) -> int:
        return sum(len(ids) for ids in self.token_ids)


def embeddings_admit(
    *, user: User, model: str, texts: list[str], dimensions: int | None, api_key: ApiKey | None = None
) -> EmbeddingsAdmitted:
    """Check an embedding request against the caller's model access and limits, cheapest
    check first, and record it in the ledger. Raises UnknownModel, InvalidRequest or
    QuotaExceeded; after a refusal nothing is recorded."""
    if model not in models_for(user=user, api_key=api_key, kind="embedding"):
        if model in models_for(user=user, api_key=api_key):
            raise InvalidRequest(
                f"The model {model!r} is a chat model: it answers at /v1/chat/completions, not with vectors.",
                param="model",
            )
        raise UnknownModel(f"The model {model!r} does not exist.")
    embedder = embedder_for(model, device=settings.CHAT_DEVICE)
    if dimensions is not None and dimensions != embedder.dimensions:
        # all-MiniLM-L6-v2 is no Matryoshka model: a shorter vector of it is no embedding.
        raise InvalidRequest(
            f"The model {model!r} makes vectors of {embedder.dimensions} dimensions only.", param="dimensions"
        )
    started = time.monotonic()
    limits = account_for(user).limits
    requests = usage_request_count(user=user, limits=limits, requested_max_tokens=None, api_key=api_key)
    try:
        token_ids = embedder.token_ids(texts, truncate=False)
    except InputTooLong as too_long:
        raise InvalidRequest(str(too_long), param="input", code="context_length_exceeded") from None
    stream_id = uuid.uuid4().hex
    _, _, quota = usage_admit(
        user=user,
        limits=limits,
        requests=requests,
        channel=UsageRecord.Channel.API,
        model=model,
        stream_id=stream_id,
        producer=runtime.PRODUCER,
        prompt_tokens=sum(len(ids) for ids in token_ids),
        max_tokens=0,
        api_key=api_key,
    )
    return EmbeddingsAdmitted(embedder, token_ids, stream_id, quota, started)


def embeddings_make(admitted: EmbeddingsAdmitted) -> Embeddings:
    """The vectors of an admitted request: model work, for a thread of its own (no database)."""
    return admitted.embedder.embed_ids(admitted.token_ids)


def embeddings_withdraw(admitted: EmbeddingsAdmitted) -> None:
    """Undo the admission of a request whose vectors were not made: nothing was served."""
    usage_withdraw(stream_id=admitted.stream_id)


def embeddings_settle(admitted: EmbeddingsAdmitted) -> None:
    """Settle an embedding request's record to its tokens, now that its vectors are made."""
    usage_finish(
        stream_id=admitted.stream_id,
        status=UsageRecord.Status.COMPLETE,
        finish_reason="stop",
        prompt_tokens=admitted.prompt_tokens,
        completion_tokens=0,
        ttft_ms=None,
        duration_ms=round((time.monotonic() - admitted.started) * 1000),
    )
