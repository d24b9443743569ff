"""Continuous batching: concurrent generations share each forward pass of one model.

New sequences join between decoding steps: their prompts are prefilled together and
their key/value rows are left-padded into the batch's cache. Finished or cancelled
sequences leave at once: their rows are dropped and all-padding columns trimmed. The
attention mask hides the padding and each row's positions count only its own tokens,
so a row decodes as it would alone. Every sequence keeps its own sampling settings,
seed, token limit and stop test. No Django imports here.

On a CPU a 135M-parameter model's decoding step is bound by reading the weights, so
eight rows cost little more than one: this is where aggregate throughput comes from.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from inference.generators import (
    SYNTHETIC_TEXT,
    GenerationOutcome,
    GenerationParams,
    Generator,
    Prompt,
    SyntheticGenerator,
    TokenText,
    TransformersGenerator,
    check_prompt,
)

if TYPE_CHECKING:
    import torch


@dataclass(eq=False)
class Sequence:
    """One generation inside a batch, as the engine hands it over."""

    prompt: Prompt
    params: GenerationParams
    on_token: Callable[[str], None]
    should_stop: Callable[[], bool]


# A sequence leaving the batch: how it ended, or what failed it alone.
Finished = tuple[Sequence, GenerationOutcome | Exception]


class Batch(Protocol):
    """Generations stepping together; one thread drives it."""

    def __len__(self) -> int: ...

    def add(self, sequence: Sequence) -> None:
        """Join at the next step; raises UnfitPrompt if the prompt can't run (empty, too long)."""

    def step(self) -> list[Finished]:
        """Advance every sequence by one token; the ones that finished, which leave.

        A sequence that alone makes the step fail leaves with its error, and the step goes
        on without it. A failure no single sequence explains is raised."""

    def cancel_all(self) -> list[Sequence]:
        """Empty the batch (after a failed step); the sequences that were in it."""


@dataclass(eq=False)
class _Row:
    sequence: Sequence
    prompt_ids: list[int]
    limit: int
    text: TokenText
    rng: torch.Generator | None
    count: int = 0
    next_id: int | None = None  # sampled, not yet fed to the model
    finish_reason: str | None = None


class TransformersBatch:
    """The rows decoding together on one model; driven by one thread calling `step()`."""

    def __init__(self, generator: TransformersGenerator) -> None:
        import torch

        self._torch = torch
        self.generator = generator
        self.model = generator.model
        self.device = generator.device
        config = self.model.generation_config
        # generate() samples from the top 50 by default; keep the same distribution.
        self.top_k = int(config.top_k) if config.top_k else 0
        self.pad_id = generator.pad_id
        self._rows: list[_Row] = []  # in cache row order
        self._joining: list[_Row] = []
        self._cache: Any = None
        self._mask: torch.Tensor | None = None  # (rows, cached length): 1 = real token
        self._prefix: tuple[list[int], list[tuple[Any, Any]]] | None = None

    def __len__(self) -> int:
        return len(self._rows) + len(self._joining)

    def add(self, sequence: Sequence) -> None:
        prompt_ids = self.generator.encode(sequence.prompt)["input_ids"][0].tolist()
        room = self.generator.check_room(len(prompt_ids))
        params = sequence.params
        rng = None
        if params.temperature > 0:
            rng = self._torch.Generator(device=self.device)
            if params.seed is not None:
                rng.manual_seed(params.seed)
            else:
                rng.seed()
        self._joining.append(_Row(sequence, prompt_ids, min(params.max_tokens, room), self.generator.token_text(), rng))

    def step(self) -> list[Finished]:
        torch = self._torch
        finished: list[Finished] = []
        with torch.inference_mode():
            logits = []
            if self._rows and (decoded := self._decode_sparing(finished)) is not None:
                logits.append(decoded)
            if self._joining:
                joined, joined_logits = self._prefill_sparing(self._joining, finished)
                self._joining = []
                if joined_logits is not None:
                    logits.append(joined_logits)
                    self._rows += joined
            if not logits:
                return finished
            chosen = self._choose(torch.cat(logits)).tolist()
        keep: list[int] = []
        for index, (row, token_id) in enumerate(zip(self._rows, chosen, strict=True)):
            try:
                self._advance(row, token_id)
            except Exception as error:  # e.g. its reader's callback: this row alone ends
                finished.append((row.sequence, error))
                continue
            if row.finish_reason is None:
                keep.append(index)
            else:
                finished.append((row.sequence, GenerationOutcome(len(row.prompt_ids), row.count, row.finish_reason)))
        if len(keep) < len(self._rows):
            self._drop_all_but(keep)
        return finished

    def _advance(self, row: _Row, token_id: int) -> None:
        """Take a row's next token: hand on its text, and decide whether it has finished."""
        row.count += 1
        row.next_id = token_id
        if token_id in self.generator.eos_ids:
            row.finish_reason = "stop"
        elif text := row.text.step(token_id):
            row.sequence.on_token(text)
        if row.finish_reason is None and row.sequence.should_stop():
            row.finish_reason = "cancelled"
        elif row.finish_reason is None and row.count >= row.limit:
            row.finish_reason = "length"

    def cancel_all(self) -> list[Sequence]:
        sequences = [row.sequence for row in [*self._rows, *self._joining]]
        self._rows, self._joining, self._cache, self._mask = [], [], None, None
        return sequences

    def _decode(self) -> torch.Tensor:
        assert self._mask is not None
        logits, self._cache, self._mask = self._decode_rows(self._rows, self._cache, self._mask)
        return logits

    def _decode_rows(self, rows: list[_Row], cache: Any, mask: torch.Tensor) -> tuple[torch.Tensor, Any, torch.Tensor]:
        """One decoding step of these rows: their logits, and their cache and mask after it."""
        torch = self._torch
        input_ids = torch.tensor([[row.next_id] for row in rows], device=self.device)
        positions = mask.sum(dim=1, keepdim=True)
        mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
        output = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return output.logits[:, -1, :].float(), output.cache, mask

    def _decode_sparing(self, finished: list[Finished]) -> torch.Tensor | None:
        """_decode(); if it fails, each row is tried alone, the ones that fail alone leave
        the batch with their error, and the rest decode together again.

        Only a failed step pays for the tries (one forward pass per row). A failure that
        no row explains alone is raised."""
        from transformers import DynamicCache

        before = [(layer.keys, layer.values) for layer in self._cache.layers]
        try:
            return self._decode()
        except Exception:
            # The forward pass may have grown some layers before it failed: undo that.
            self._cache = DynamicCache(before)
            failing: dict[int, Exception] = {}
            for index, row in enumerate(self._rows):
                try:
                    self._decode_rows([row], *self._rows_state([index]))
                except Exception as row_error:
                    failing[index] = row_error
            if not failing:
                raise
        finished += [(self._rows[index].sequence, row_error) for index, row_error in failing.items()]
        self._drop_all_but([index for index in range(len(self._rows)) if index not in failing])
        return self._decode() if self._rows else None

    def _prefill_sparing(self, rows: list[_Row], finished: list[Finished]) -> tuple[list[_Row], torch.Tensor | None]:
        """_prefill(); if it fails, each prompt is prefilled alone and the ones that fail
        leave with their error: one bad prompt never fails the others joining with it."""
        try:
            return self._prefill(rows)
        except Exception as error:
            if len(rows) == 1:
                finished.append((rows[0].sequence, error))
                return [], None
        joined: list[_Row] = []
        logits = []
        for row in rows:
            try:
                _, row_logits = self._prefill([row])
            except Exception as error:
                finished.append((row.sequence, error))
                continue
            joined.append(row)
            logits.append(row_logits)
        return joined, self._torch.cat(logits) if logits else None

    def _prefill(self, rows: list[_Row]) -> tuple[list[_Row], torch.Tensor]:
        """Run the joining prompts and merge their cache rows in: the rows in their new
        order, and each one's logits for its first token. Nothing is merged unless every
        prompt ran.

        Prompts that open with the chat template's usual beginning (its system prompt, up
        to the first message) start from that beginning's keys and values, computed once:
        on a CPU the prefill is bound by arithmetic, so this saves most of a short
        chat's time to first token."""
        torch = self._torch
        prefix_ids, prefix_kv = self._template_prefix()
        skip = len(prefix_ids)
        sharing = [row for row in rows if skip and row.prompt_ids[:skip] == prefix_ids and len(row.prompt_ids) > skip]
        others = [row for row in rows if row not in sharing]
        groups = []
        if sharing:
            groups.append(self._prefill_group(sharing, skip, prefix_kv))
        if others:
            groups.append(self._prefill_group(others, 0, []))
        for cache, mask, _ in groups:
            self._merge(cache, mask)
        return sharing + others, torch.cat([logits for _, _, logits in groups])

    def _prefill_group(
        self, rows: list[_Row], skip: int, prefix_kv: list[tuple[Any, Any]]
    ) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """Prefill these rows' prompts after their first `skip` tokens, whose keys and
        values are given, left-padding the rest to one width: their cache, mask and logits."""
        from transformers import DynamicCache

        torch = self._torch
        rests = [row.prompt_ids[skip:] for row in rows]
        width = max(len(rest) for rest in rests)
        input_ids = torch.tensor([[self.pad_id] * (width - len(rest)) + rest for rest in rests], device=self.device)
        mask = torch.tensor([[1] * skip + [0] * (width - len(rest)) + [1] * len(rest) for rest in rests])
        mask = mask.to(self.device)
        cache = None
        if prefix_kv:  # the padding sits between the prefix and the rest: the mask hides it
            shape = (len(rows), -1, -1, -1)
            cache = DynamicCache([(keys.expand(shape), values.expand(shape)) for keys, values in prefix_kv])
        output = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(dim=1) - 1).clamp(min=0)[:, skip:],
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return output.cache, mask, output.logits[:, -1, :].float()

    def _template_prefix(self) -> tuple[list[int], list[tuple[Any, Any]]]:
        """The chat template's usual beginning and its keys and values per layer."""
        if self._prefix is None:
            ids = self.generator.template_prefix()
            kv: list[tuple[Any, Any]] = []
            if ids:
                output = self.model(input_ids=self._torch.tensor([ids], device=self.device), use_cache=True)
                kv = [(layer.keys, layer.values) for layer in output.cache.layers]
            self._prefix = (ids, kv)
        return self._prefix

    def _merge(self, cache: Any, mask: torch.Tensor) -> None:
        from transformers import DynamicCache

        torch = self._torch
        if self._cache is None or self._mask is None:
            self._cache, self._mask = cache, mask
            return
        width = max(self._mask.shape[1], mask.shape[1])
        layers = [
            (
                torch.cat([_left_pad(old.keys, width, 2), _left_pad(new.keys, width, 2)]),
                torch.cat([_left_pad(old.values, width, 2), _left_pad(new.values, width, 2)]),
            )
            for old, new in zip(self._cache.layers, cache.layers, strict=True)
        ]
        self._cache = DynamicCache(layers)
        self._mask = torch.cat([_left_pad(self._mask, width, 1), _left_pad(mask, width, 1)])

    def _drop_all_but(self, keep: list[int]) -> None:
        self._rows = [self._rows[index] for index in keep]
        if not keep:
            self._cache, self._mask = None, None
            return
        self._cache, self._mask = self._rows_state(keep)

    def _rows_state(self, keep: list[int]) -> tuple[Any, torch.Tensor]:
        """The cache and mask of just these rows, without the columns that are padding in all of them."""
        from transformers import DynamicCache

        assert self._mask is not None
        index = self._torch.tensor(keep, device=self.device)
        mask = self._mask.index_select(0, index)
        start = int(mask.any(dim=0).nonzero()[0])  # columns before it are padding in every row
        cache = DynamicCache(
            [
                (layer.keys.index_select(0, index)[:, :, start:], layer.values.index_select(0, index)[:, :, start:])
                for layer in self._cache.layers
            ]
        )
        return cache, mask[:, start:]

    def _choose(self, logits: torch.Tensor) -> torch.Tensor:
        """The next token of every row: greedy where temperature is 0, else sampled with
        the row's own temperature, top-p and random generator."""
        torch = self._torch
        chosen = logits.argmax(dim=-1)
        sampled = [index for index, row in enumerate(self._rows) if row.rng is not None]
        if not sampled:
            return chosen
        rows = [self._rows[index] for index in sampled]
        scaled = logits[sampled] / torch.tensor([[row.sequence.params.temperature] for row in rows], device=self.device)
        k = min(self.top_k or scaled.shape[-1], scaled.shape[-1])
        top_logits, top_ids = scaled.topk(k, dim=-1)  # sorted, largest first
        probs = top_logits.softmax(dim=-1)
        top_p = torch.tensor([[row.sequence.params.top_p] for row in rows], device=self.device)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        probs = probs.masked_fill(probs.cumsum(dim=-1) - probs >= top_p, 0.0)
        cumulative = probs.cumsum(dim=-1)
        draws = torch.stack([torch.rand((), generator=row.rng, device=self.device) for row in rows])
        picks = (cumulative < draws[:, None] * cumulative[:, -1:]).sum(dim=-1).clamp(max=k - 1)
        chosen[sampled] = top_ids.gather(1, picks[:, None]).squeeze(1)
        return chosen


def _left_pad(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """`tensor` grown to `width` along `dim` with zeros in front (padding, masked out)."""
    import torch

    missing = width - tensor.shape[dim]
    if not missing:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


@dataclass(eq=False)
class _SyntheticRow:
    sequence: Sequence
    prompt_tokens: int
    limit: int
    words: Iterator[str]
    count: int = 0


class SyntheticBatch:
    """The synthetic model, batched: on every tick each sequence gets its next word."""

    def __init__(self, generator: SyntheticGenerator) -> None:
        self.generator = generator
        self._rows: list[_SyntheticRow] = []
        self._next_tick = 0.0

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, sequence: Sequence) -> None:
        if not self._rows:  # after an idle spell the clock starts afresh, with no burst of late ticks
            self._next_tick = time.monotonic()
        prompt_tokens = self.generator.count_prompt_tokens(sequence.prompt)
        check_prompt(prompt_tokens, self.generator.context_length)
        limit = self.generator.answer_length(sequence.params)
        words = itertools.cycle(SYNTHETIC_TEXT.split())
        self._rows.append(_SyntheticRow(sequence, prompt_tokens, limit, words))

    def step(self) -> list[Finished]:
        # Ticks keep to the rate: a late tick (a busy machine) is caught up on, as a
        # stream of the real model would deliver what it generated meanwhile.
        self._next_tick += self.generator.interval
        time.sleep(max(0.0, self._next_tick - time.monotonic()))
        finished = []
        for row in self._rows:
            if row.sequence.should_stop():
                finished.append((row, "cancelled"))
                continue
            row.sequence.on_token(("" if row.count == 0 else " ") + next(row.words))
            row.count += 1
            if row.count >= row.limit:
                finished.append((row, self.generator.finish_reason(row.limit)))
        done = {id(row) for row, _ in finished}
        self._rows = [row for row in self._rows if id(row) not in done]
        return [(row.sequence, GenerationOutcome(row.prompt_tokens, row.count, reason)) for row, reason in finished]

    def cancel_all(self) -> list[Sequence]:
        sequences = [row.sequence for row in self._rows]
        self._rows = []
        return sequences


def open_batch(generator: Generator) -> Batch:
    """An empty batch of the generator's model."""
    if isinstance(generator, SyntheticGenerator):
        return SyntheticBatch(generator)
    assert isinstance(generator, TransformersGenerator), f"{generator!r} cannot batch"
    return TransformersBatch(generator)
