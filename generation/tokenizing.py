"""A model's tokenizer for those who may use the model: /tokenize and /detokenize (vLLM's).

Tokenizing generates nothing, so it is not counted against a plan's requests or tokens
(nor is it in vLLM); the caller's access to the model is checked as for a generation.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import User

from accounts.models import ApiKey
from accounts.services import InvalidRequest
from generation.backends.router import backend
from generation.services import models_for
from inference.generators import ChatTokenizer
from inference.registry import UnknownModel


@dataclass(frozen=True)
class ModelTokenizer:
    tokenizer: ChatTokenizer
    # The prompt and answer tokens the model holds, as generations are admitted against it.
    max_model_len: int


def tokenizer_for(*, user: User, model: str, api_key: ApiKey | None = None) -> ModelTokenizer:
    """`model`'s tokenizer. Raises UnknownModel for a model the caller may not use, exactly
    as for one that does not exist; InvalidRequest for a model without a tokenizer here (the
    synthetic model, a model server's with none configured); EngineOverloaded while it loads."""
    if model not in models_for(user=user, api_key=api_key):
        raise UnknownModel(f"The model {model!r} does not exist.")
    runner = backend()
    tokenizer = runner.tokenizer(model)
    if tokenizer is None:
        raise InvalidRequest(f"The model {model!r} has no tokenizer.", param="model")
    return ModelTokenizer(tokenizer, runner.context_length(model))
