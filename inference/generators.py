"""Token sources behind the engine: a transformers model, or the synthetic model.

A generator turns chat messages into text pieces, calling `on_token` as each piece
is ready and checking `should_stop` at every decoding step. No Django imports here.

torch, transformers and inference.loading (which imports torch: 2.6 s here) are imported
where a real model is used, so that a process serving only the synthetic model never
pays for them.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from jinja2 import TemplateError

from inference.registry import ModelSpec

logger = logging.getLogger(__name__)

Messages = list[dict[str, Any]]
# A chat (rendered with the model's chat template) or a raw text prompt.
Prompt = Messages | str


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # Request fields only some backends take (tools, response_format, ...), passed on as given.
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GenerationOutcome:
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" | "length" | "cancelled"
    cached_tokens: int = 0  # of the prompt's, those whose keys and values were reused (PrefixCache)


class UnfitPrompt(ValueError):
    """A prompt the model cannot run: refused before it joins a batch, never a failed step."""


class ContextLengthExceeded(UnfitPrompt):
    pass


class EmptyPrompt(UnfitPrompt):
    pass


class UnknownTokenId(ValueError):
    """A token id outside the model's vocabulary."""


def check_prompt(prompt_tokens: int, context_length: int) -> int:
    """How many tokens the context leaves for the answer; UnfitPrompt if the prompt can't run.

    A prompt of no tokens gives the model nothing to attend to (its forward pass fails)."""
    if prompt_tokens == 0:
        raise EmptyPrompt("The prompt is empty: it has no tokens for the model to continue from.")
    room = context_length - prompt_tokens
    if room <= 0:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {context_length} tokens; the prompt is {prompt_tokens} tokens."
        )
    return room


class Generator(Protocol):
    name: str
    context_length: int

    def count_prompt_tokens(self, prompt: Prompt) -> int: ...

    def generate(
        self,
        prompt: Prompt,
        params: GenerationParams,
        on_token: Callable[[str], None],
        should_stop: Callable[[], bool],
    ) -> GenerationOutcome: ...


class ChatTokenizer:
    """A model's tokenizer and context length: what counting a prompt's tokens needs.

    Web processes of GENERATION_BACKEND=celery load only this, to refuse prompts that do
    not fit before queueing them; the model itself lives in the workers.
    """

    def __init__(self, name: str, tokenizer: Any, context_length: int) -> None:
        self.name = name
        self.tokenizer = tokenizer
        self.context_length = context_length

    def encode(self, prompt: Prompt) -> Any:
        if isinstance(prompt, str):
            return self.tokenizer(prompt, return_tensors="pt")
        return self.tokenizer.apply_chat_template(
            prompt, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )

    def count_prompt_tokens(self, prompt: Prompt) -> int:
        return int(self.encode(prompt)["input_ids"].shape[1])

    def template_prefix(self) -> list[int]:
        """The tokens every chat prompt begins with: the chat template's opening (e.g. its
        default system prompt) up to the first message's text. Empty without a template."""
        if not self.tokenizer.chat_template:
            return []
        first, second = (self.encode([{"role": "user", "content": text}])["input_ids"][0].tolist() for text in "ab")
        length = next((n for n, (a, b) in enumerate(zip(first, second, strict=False)) if a != b), 0)
        return [int(token) for token in first[:length]]

    def check_room(self, prompt_tokens: int) -> int:
        """How many tokens the context leaves for the answer; UnfitPrompt if the prompt can't run."""
        return check_prompt(prompt_tokens, self.context_length)

    # /tokenize and /detokenize (vLLM's), with the tokenizer that counts the prompts.
    @property
    def vocabulary_size(self) -> int:
        """Token ids run from 0 to this, added tokens included."""
        return len(self.tokenizer)

    @property
    def has_chat_template(self) -> bool:
        return bool(self.tokenizer.chat_template)

    def tokenize(
        self,
        prompt: Prompt,
        *,
        add_special_tokens: bool,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> list[int]:
        """A text's tokens, or a chat's as its template renders it. The template writes the
        chat's special tokens itself: `add_special_tokens` adds the tokenizer's (a BOS) too."""
        if not isinstance(prompt, str):
            try:
                prompt = self.tokenizer.apply_chat_template(
                    prompt,
                    tokenize=False,
                    add_generation_prompt=add_generation_prompt,
                    continue_final_message=continue_final_message,
                )
            except (TemplateError, ValueError) as refused:  # its raise_exception(), or roles out of turn
                raise UnfitPrompt(f"The model's chat template refuses these messages: {refused}") from None
        return [int(token) for token in self.tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"]]

    def token_strings(self, tokens: list[int]) -> list[str]:
        return [str(piece) for piece in self.tokenizer.convert_ids_to_tokens(tokens)]

    def detokenize(self, tokens: list[int]) -> str:
        """The text of token ids, special tokens included (as vLLM); UnknownTokenId for an id
        outside the vocabulary."""
        size = self.vocabulary_size
        unknown = next((token for token in tokens if not 0 <= token < size), None)
        if unknown is not None:
            raise UnknownTokenId(f"Token id {unknown} is not in the model's vocabulary (0 to {size - 1}).")
        return str(self.tokenizer.decode(tokens, skip_special_tokens=False))


def context_length_of(config: Any) -> int:
    return int(getattr(config, "max_position_embeddings", 2048))


class TransformersGenerator(ChatTokenizer):
    def __init__(self, name: str, model: Any, tokenizer: Any) -> None:
        import torch

        super().__init__(name, tokenizer, context_length_of(model.config))
        self.model = model
        self.device = model.device
        eos = model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos_ids), 0)
        self._torch = torch

    def token_text(self) -> TokenText:
        return TokenText(self.tokenizer)

    def generate(
        self,
        prompt: Prompt,
        params: GenerationParams,
        on_token: Callable[[str], None],
        should_stop: Callable[[], bool],
    ) -> GenerationOutcome:
        from transformers import StoppingCriteriaList

        torch = self._torch
        inputs = self.encode(prompt).to(self.device)
        prompt_tokens = int(inputs["input_ids"].shape[1])
        room = self.check_room(prompt_tokens)
        streamer = _DeltaStreamer(self.token_text(), on_token, self.eos_ids)
        sampling: dict[str, Any] = {"do_sample": False}
        if params.temperature > 0:
            sampling = {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p}
            if params.seed is not None:
                torch.manual_seed(params.seed)
        with torch.inference_mode():
            self.model.generate(
                **inputs,
                **sampling,
                max_new_tokens=min(params.max_tokens, room),
                streamer=streamer,
                stopping_criteria=StoppingCriteriaList([_CancelCriteria(should_stop)]),
                pad_token_id=self.pad_id,
            )
        if should_stop():
            finish_reason = "cancelled"
        elif streamer.last_id in self.eos_ids:
            finish_reason = "stop"
        else:
            finish_reason = "length"
        return GenerationOutcome(prompt_tokens, streamer.count, finish_reason)


class TokenText:
    """The text of a token sequence, one token at a time, in O(1) per token.

    tokenizers' DecodeStream holds back the bytes of a character split across tokens,
    so multi-byte characters are never cut. (TextIteratorStreamer re-decodes the tail
    and waits for a word boundary, which delays the first token.)
    """

    def __init__(self, tokenizer: Any) -> None:
        from tokenizers.decoders import DecodeStream

        self._backend = tokenizer._tokenizer
        self._decoder = DecodeStream(skip_special_tokens=True)

    def step(self, token_id: int) -> str | None:
        """The new text this token completes, if any."""
        return self._decoder.step(self._backend, token_id)


class _DeltaStreamer:
    """A generate() streamer that feeds each new token's text to a callback at once."""

    def __init__(self, text: TokenText, on_token: Callable[[str], None], eos_ids: set[int]) -> None:
        self._text = text
        self._on_token = on_token
        self._eos_ids = eos_ids
        self._prompt_seen = False
        self.count = 0
        self.last_id: int | None = None

    def put(self, value: Any) -> None:
        if not self._prompt_seen:  # generate() first hands over the prompt
            self._prompt_seen = True
            return
        for token_id in value.reshape(-1).tolist():
            self.count += 1
            self.last_id = token_id
            if token_id in self._eos_ids:
                continue
            if text := self._text.step(token_id):
                self._on_token(text)

    def end(self) -> None:
        pass


class _CancelCriteria:
    """Ends generation at the next decoding step once the cancel flag is set."""

    def __init__(self, should_stop: Callable[[], bool]) -> None:
        self._should_stop = should_stop

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        return torch.full((input_ids.shape[0],), self._should_stop(), dtype=torch.bool, device=input_ids.device)


SYNTHETIC_TEXT = (
    "Streaming tokens one at a time lets people read the answer while it is still being "
    "written, and lets them stop it early when it goes the wrong way."
)


class SyntheticGenerator:
    """Emits words at a fixed rate with no neural network, for load and fault tests.

    Its answer is `answer_words` long, or when that is None, as long as max_tokens
    allows: load tests set the length of each stream through max_tokens.
    """

    name = "synthetic"
    context_length = 1_000_000

    def __init__(self, tokens_per_s: float, answer_words: int | None = None) -> None:
        self.interval = 1.0 / tokens_per_s
        self.answer_words = answer_words

    def count_prompt_tokens(self, prompt: Prompt) -> int:
        if isinstance(prompt, str):
            return len(prompt.split())
        return sum(len(m["content"].split()) for m in prompt)

    def answer_length(self, params: GenerationParams) -> int:
        return params.max_tokens if self.answer_words is None else min(params.max_tokens, self.answer_words)

    def finish_reason(self, length: int) -> str:
        """Why an answer of `length` words that ran to its end ended."""
        return "stop" if length == self.answer_words else "length"

    def generate(
        self,
        prompt: Prompt,
        params: GenerationParams,
        on_token: Callable[[str], None],
        should_stop: Callable[[], bool],
    ) -> GenerationOutcome:
        prompt_tokens = self.count_prompt_tokens(prompt)
        check_prompt(prompt_tokens, self.context_length)
        words = itertools.cycle(SYNTHETIC_TEXT.split())
        limit = self.answer_length(params)
        count = 0
        next_at = time.monotonic()
        while count < limit:
            if should_stop():
                return GenerationOutcome(prompt_tokens, count, "cancelled")
            next_at += self.interval
            time.sleep(max(0.0, next_at - time.monotonic()))
            on_token(("" if count == 0 else " ") + next(words))
            count += 1
        return GenerationOutcome(prompt_tokens, count, self.finish_reason(limit))


def load_generator(
    spec: ModelSpec,
    *,
    cache_dir: Path,
    device: str,
    synthetic_tokens_per_s: float,
    dtype: str = "auto",
    quantization: str = "none",
) -> Generator:
    """Build the generator for a model spec, converting packaged GGUF weights once."""
    from inference.loading import load_pretrained, resolve_device

    if spec.synthetic:
        return SyntheticGenerator(synthetic_tokens_per_s)
    torch_device = resolve_device(device)
    started = time.monotonic()
    model, tokenizer = _load_model_files(
        spec, cache_dir, lambda source: load_pretrained(source, torch_device, dtype, quantization)
    )
    logger.info("Loaded %s on %s (%s) in %.1f s", spec.name, torch_device, model.dtype, time.monotonic() - started)
    return TransformersGenerator(spec.name, model, tokenizer)


def load_chat_tokenizer(
    spec: ModelSpec, *, cache_dir: Path, synthetic_tokens_per_s: float
) -> ChatTokenizer | Generator:
    """What counting prompt tokens needs, without the model's weights in memory."""
    from inference.loading import load_tokenizer_and_config

    if spec.synthetic:
        return SyntheticGenerator(synthetic_tokens_per_s)
    config, tokenizer = _load_model_files(spec, cache_dir, load_tokenizer_and_config)
    return ChatTokenizer(spec.name, tokenizer, context_length_of(config))


def _load_model_files(
    spec: ModelSpec, cache_dir: Path, load: Callable[[str | Path], tuple[Any, Any]]
) -> tuple[Any, Any]:
    """`load` applied to the model's files: the packaged GGUF converted once, or its source.

    `load` returns (something, tokenizer); the spec's chat template is added where the
    tokenizer lacks one.
    """
    from inference.loading import assemble_gguf, cached_conversion, convert_gguf

    if spec.gguf_parts:
        return cached_conversion(  # type: ignore[no-any-return]
            assemble_gguf(spec, cache_dir),
            cache_dir,
            convert=lambda source, target: convert_gguf(source, target, chat_template=spec.chat_template),
            load=load,
        )
    loaded, tokenizer = load(spec.source)
    if spec.chat_template and not tokenizer.chat_template:
        tokenizer.chat_template = spec.chat_template
    return loaded, tokenizer
