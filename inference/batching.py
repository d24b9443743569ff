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
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from inference.attention import CPU_DECODE_ATTENTION
from inference.generators import (
    SYNTHETIC_TEXT,
    GenerationOutcome,
    GenerationParams,
    Generator,
    Prompt,
    SyntheticGenerator,
    TokenText,
    TransformersGenerator,
    UnfitPrompt,
    check_prompt,
)
from inference.prefix_cache import LayerKV, PrefixCache

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

T = TypeVar("T")

# One CUDA graph capture at a time in the process: two engines capturing at once (two
# models, each its own thread) would each see the other's work on the device.
CAPTURING = threading.Lock()


@dataclass(eq=False)
class Sequence:
    """One generation inside a batch, as the engine hands it over."""

    prompt: Prompt
    params: GenerationParams
    on_token: Callable[[str], None]
    should_stop: Callable[[], bool]
    owner: str = ""  # whose it is: it starts only from its own owner's earlier sequences (PrefixCache)


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
    tokens: list[int] = field(default_factory=list)  # sampled so far, next_id last
    finish_reason: str | None = None
    cached: int = 0  # tokens in its key/value slot (StaticBatch)
    reused: int = 0  # the prompt's first tokens, whose keys and values it started from


class TransformersBatch:
    """The rows decoding together on one model; driven by one thread calling `step()`."""

    def __init__(self, generator: TransformersGenerator, *, prefix_cache_bytes: int = 0) -> None:
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
        # Finished sequences' keys and values, for prompts that begin the same way. Only
        # where every layer attends to every earlier token: a sliding window's layers keep
        # only its last tokens, so no prefix of them is whole.
        self.prefixes = PrefixCache(prefix_cache_bytes if not partial_attention(self.model.config) else 0)
        self._template_shared = False

    def __len__(self) -> int:
        return len(self._rows) + len(self._joining)

    def add(self, sequence: Sequence) -> None:
        prompt_ids = self.generator.encode(sequence.prompt)["input_ids"][0].tolist()
        room = self.generator.check_room(len(prompt_ids))
        params = sequence.params
        rng = None
        if params.temperature > 0:
            # On the CPU whatever the model's device: a step draws every row's number on
            # the host and moves them in one copy, not one device kernel per row.
            rng = self._torch.Generator(device="cpu")
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
                outcome = GenerationOutcome(len(row.prompt_ids), row.count, row.finish_reason, row.reused)
                finished.append((row.sequence, outcome))
        if len(keep) < len(self._rows):
            kept = set(keep)
            for index, row in enumerate(self._rows):
                if index not in kept and row.finish_reason is not None:
                    self._remember(index)
            self._drop_all_but(keep)
        return finished

    def _remember(self, index: int) -> None:
        """Keep the keys and values of the row's tokens (its prompt, and its answer but the
        last token, which the model never ran) for its owner's later prompts."""
        if not self.prefixes.budget_bytes:
            return
        row = self._rows[index]
        self.prefixes.add(row.sequence.owner, row.prompt_ids + row.tokens[:-1], self._row_kv(index))

    def _row_kv(self, index: int) -> LayerKV:
        """A copy of the keys and values of the row's tokens, per layer, without padding."""
        assert self._mask is not None
        real = self._mask[index].bool()
        return [
            (layer.keys[index : index + 1, :, real], layer.values[index : index + 1, :, real])
            for layer in self._cache.layers
        ]

    def _advance(self, row: _Row, token_id: int) -> None:
        """Take a row's next token: hand on its text, and decide whether it has finished."""
        row.count += 1
        row.next_id = token_id
        row.tokens.append(token_id)
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
        if self.device.type == "cuda":  # after a failed step (e.g. out of memory): hand back what it held
            self._torch.cuda.empty_cache()
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

        Each prompt starts after the longest beginning whose keys and values are known
        (PrefixCache: its owner's earlier sequences, or the chat template's usual
        beginning): on a CPU the prefill is bound by arithmetic, so this saves most of a
        short chat's time to first token, and a long conversation's whole history."""
        self._share_template_prefix()
        starts = [self.prefixes.longest(row.sequence.owner, row.prompt_ids) for row in rows]
        for row, (skip, _) in zip(rows, starts, strict=True):
            row.reused = skip
        cache, mask, logits = self._prefill_rows(rows, starts)
        self._merge(rows, cache, mask)
        return rows, logits

    def _prefill_rows(
        self, rows: list[_Row], starts: list[tuple[int, LayerKV]]
    ) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """Prefill these rows' prompts, each after the first `skip` tokens whose keys and
        values `starts` gives: their cache, mask and logits.

        In the cache each row's known tokens are left-padded to the longest of them, and
        the rest of its prompt after them to the longest rest; the mask hides both paddings."""
        from transformers import DynamicCache

        torch = self._torch
        past = max(skip for skip, _ in starts)
        rests = [row.prompt_ids[skip:] for row, (skip, _) in zip(rows, starts, strict=True)]
        width = max(len(rest) for rest in rests)
        input_ids = torch.tensor([[self.pad_id] * (width - len(rest)) + rest for rest in rests], device=self.device)
        mask = torch.tensor(
            [
                [0] * (past - skip) + [1] * skip + [0] * (width - len(rest)) + [1] * len(rest)
                for (skip, _), rest in zip(starts, rests, strict=True)
            ]
        ).to(self.device)
        cache = None
        if past:
            # Rows that start from nothing take a known one's columns cut to none, padded.
            some = next(kv for skip, kv in starts if skip)
            layers = []
            for layer in range(len(some)):
                keys, values = [], []
                for skip, kv in starts:
                    layer_keys, layer_values = (kv or some)[layer]
                    keys.append(_left_pad(layer_keys[:, :, :skip], past, 2))
                    values.append(_left_pad(layer_values[:, :, :skip], past, 2))
                layers.append((torch.cat(keys), torch.cat(values)))
            cache = DynamicCache(layers)
        output = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(dim=1) - 1).clamp(min=0)[:, past:],
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return output.cache, mask, output.logits[:, -1, :].float()

    def _share_template_prefix(self) -> None:
        """Run the chat template's usual beginning once, for every prompt to start from."""
        if self._template_shared:
            return
        ids = self.generator.template_prefix()
        if ids:
            output = self.model(input_ids=self._torch.tensor([ids], device=self.device), use_cache=True)
            self.prefixes.share(ids, [(layer.keys, layer.values) for layer in output.cache.layers])
        self._template_shared = True

    def _merge(self, rows: list[_Row], cache: Any, mask: torch.Tensor) -> None:
        """Take in the joining rows' prefilled cache (left-padded, `mask` 1 on real tokens)."""
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
        draws = torch.tensor([torch.rand((), generator=row.rng).item() for row in rows], device=self.device)
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


# Rows are padded up to one of these counts, so that each count's decoding step has one
# shape (one CUDA graph each); beyond the last, the next power of two.
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# Attention reads the slots' first columns only, a power of two from this many up.
SHORTEST_WIDTH = 64


def row_bucket(rows: int) -> int:
    """The padded row count a step of `rows` rows runs at."""
    return next((size for size in ROW_BUCKETS if size >= rows), 1 << (rows - 1).bit_length())


# The share of the memory free after the weights that the key/value slots may take; the
# rest is for the prefill's own cache and the activations.
SLOT_MEMORY_SHARE = 0.8


class SlotsDontFit(RuntimeError):
    """Not even one key/value slot fits in the memory free: the batch can't open."""


def slots_that_fit(wanted: int, slot_bytes: int, row_tokens: int, free_bytes: int | None) -> int:
    """The slots to allocate: `wanted` (a row bucket), or the largest bucket below it
    that SLOT_MEMORY_SHARE of `free_bytes` holds (unknown free memory: `wanted`).

    Sized once when the batch opens, never per request: 256 slots of 4,096 tokens of an
    8B model are 128 GiB, more than any one GPU holds beside its 16 GB of weights."""
    if free_bytes is None:
        return wanted
    budget = int(free_bytes * SLOT_MEMORY_SHARE)
    if wanted * slot_bytes <= budget:
        return wanted
    fits = budget // slot_bytes
    need = f"{wanted} slots of {row_tokens} tokens need {wanted * slot_bytes / 2**30:.1f} GiB of keys and values"
    if fits < 1:
        raise SlotsDontFit(
            f"{need}, and not even one fits in {budget / 2**30:.1f} GiB "
            f"({SLOT_MEMORY_SHARE:.0%} of the memory free): lower GENERATION_SLOT_TOKENS"
        )
    capacity = 1 << (fits.bit_length() - 1)  # a row bucket: every step's padded rows have slots
    logger.warning(
        "%s; %.1f GiB are free, so %d slots: at most %d generations decode at once",
        need,
        free_bytes / 2**30,
        capacity,
        capacity,
    )
    return capacity


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new tensors on `device` (the CUDA device's free memory, or the
    host's available memory), None where that can't be told."""
    import torch

    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):  # not Linux
        return None


class _SlotCache:
    """The key/value slots, as the model's cache for one decoding step of slots
    `start:stop`: each row's new key and value are written at its own position, and
    attention reads the first `width` columns of those slots (views, no copies)."""

    def __init__(
        self,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        slots: slice,
        index: torch.Tensor,
        positions: torch.Tensor,
        width: int,
    ) -> None:
        self.keys, self.values = keys, values
        self.slots, self.index, self.positions, self.width = slots, index, positions, width

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        # Tensor indices, not Python numbers: the same captured step serves every position.
        keys[self.index, :, self.positions] = key_states[:, :, 0]
        values[self.index, :, self.positions] = value_states[:, :, 0]
        return keys[self.slots, :, : self.width], values[self.slots, :, : self.width]


class StaticBatch(TransformersBatch):
    """The batch with static shapes, for CUDA graphs (as vLLM-class servers decode).

    Every row owns a preallocated key/value slot: row i of the batch is slot i, its
    tokens in columns 0 to its length, with no padding. A decoding step runs the rows
    padded up to a row bucket (1, 2, 4 ... 256) over the slots' first `width` columns (a
    power of two), so each (bucket, width) pair has one shape: on CUDA its step is
    captured once as a CUDA graph and replayed, which removes the per-kernel launch
    cost that bounds eager decoding of a small model. The padding rows decode token 0
    in spare slots; nobody reads what they make. Prefill stays eager (the dynamic path's
    left-padded prefill, its rows then copied into their slots). A row that leaves
    hands its slot to the last row, which moves into it (one row's copy).

    On a CPU the same code runs without graphs, which is how its answers are tested:
    greedy rows give what `generate()` gives alone.
    """

    # Each (rows, width) shape's captured step and its logits tensor; None: capture failed.
    _graphs: dict[tuple[int, int], tuple[Any, torch.Tensor] | None]

    def __init__(
        self,
        generator: TransformersGenerator,
        *,
        max_rows: int,
        row_tokens: int,
        cuda_graphs: bool,
        compiled: bool = False,
        prefix_cache_bytes: int = 0,
    ) -> None:
        super().__init__(generator, prefix_cache_bytes=prefix_cache_bytes)
        torch = self._torch
        config = self.model.config
        self.row_tokens = min(row_tokens, generator.context_length)
        self.cuda_graphs = cuda_graphs
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dtype, device = self.model.dtype, self.device
        slot_bytes = 2 * config.num_hidden_layers * heads * self.row_tokens * head_dim * dtype.itemsize
        self.capacity = slots_that_fit(row_bucket(max_rows), slot_bytes, self.row_tokens, available_memory(device))
        shape = (self.capacity, heads, self.row_tokens, head_dim)
        self._keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self._values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        # A step's inputs live in fixed tensors: a captured graph reads them where they were.
        self._ids = torch.zeros((self.capacity, 1), dtype=torch.long, device=device)
        self._lengths = torch.zeros(self.capacity, dtype=torch.long, device=device)
        self._slot_index = torch.arange(self.capacity, device=device)
        self._columns = torch.arange(self.row_tokens, device=device)
        self._additive_mask = config._attn_implementation == "eager"  # sdpa takes booleans
        self._graphs = {}
        self._graph_pool: Any = None
        # The eager step, or the same step compiled (compile_now) where no graph replays it.
        self._step: Callable[[slice, int], Any] = self._forward
        if compiled and not cuda_graphs:
            self._step = compiled_step(self._forward, freeze=plain_weights(self.model))
        self._filled = 0  # slots taken, rows joined in this step included
        megabytes = 2 * len(self._keys) * self._keys[0].numel() * self._keys[0].element_size() / 2**20
        logger.info(
            "Static decoding: %d slots of %d tokens (%.0f MiB of keys and values), CUDA graphs %s",
            self.capacity,
            self.row_tokens,
            megabytes,
            "on" if cuda_graphs else "off",
        )

    def add(self, sequence: Sequence) -> None:
        super().add(sequence)
        row = self._joining[-1]
        try:
            room = check_prompt(len(row.prompt_ids), self.row_tokens)  # a slot holds prompt and answer
        except UnfitPrompt:
            self._joining.pop()
            raise
        row.limit = min(row.limit, room)

    def cancel_all(self) -> list[Sequence]:
        self._filled = 0
        return super().cancel_all()

    def _decode_sparing(self, finished: list[Finished]) -> torch.Tensor | None:
        """_decode(); if it fails, each row is tried alone, and the ones that fail alone
        leave with their error. Nothing needs undoing: a step only writes each row's
        column at its length, which the next step writes again."""
        try:
            return self._decode()
        except Exception:
            failing: dict[int, Exception] = {}
            for index in range(len(self._rows)):
                try:
                    self._forward(slice(index, index + 1), self._width())
                except Exception as row_error:
                    failing[index] = row_error
            if not failing:
                raise
        finished += [(self._rows[index].sequence, row_error) for index, row_error in failing.items()]
        self._drop_all_but([index for index in range(len(self._rows)) if index not in failing])
        return self._decode() if self._rows else None

    def _decode(self) -> torch.Tensor:
        torch = self._torch
        count = len(self._rows)
        padded = row_bucket(count)
        pad = padded - count
        ids = torch.tensor([row.next_id for row in self._rows] + [0] * pad)
        lengths = torch.tensor([row.cached for row in self._rows] + [0] * pad)
        self._ids[:padded, 0].copy_(ids, non_blocking=True)
        self._lengths[:padded].copy_(lengths, non_blocking=True)
        width = self._width()
        logits = self._replay(padded, width) if self.cuda_graphs else self._step(slice(0, padded), width)
        for row in self._rows:
            row.cached += 1
        return logits[:count].float()

    def _width(self) -> int:
        """The columns this step's attention reads: every row's tokens and its new one."""
        needed = max(row.cached for row in self._rows) + 1
        widths = step_widths(self.row_tokens)
        return next((width for width in widths if width >= needed), widths[-1])

    def _forward(self, slots: slice, width: int) -> torch.Tensor:
        """One decoding step of these slots' rows (inputs in the step tensors): their logits."""
        positions = self._lengths[slots]
        visible = (self._columns[:width] <= positions[:, None])[:, None, None, :]
        mask = visible
        if self._additive_mask:
            dtype = self.model.dtype
            mask = self._torch.zeros(visible.shape, dtype=dtype, device=self.device).masked_fill(
                ~visible, self._torch.finfo(dtype).min
            )
        cache = _SlotCache(self._keys, self._values, slots, self._slot_index[slots], positions, width)
        output = self.model(
            input_ids=self._ids[slots],
            attention_mask=mask,
            position_ids=positions[:, None],
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits: torch.Tensor = output.logits[:, -1, :]
        return logits

    def capture_all(self) -> None:
        """Capture every step shape now (static_shapes), before the batch serves: captured
        while serving, each new shape stalled every stream. Logged with what it cost."""
        started = time.monotonic()
        shapes = static_shapes(self.capacity, self.row_tokens)
        failed = sum(self._graph(rows, width) is None for rows, width in shapes)
        logger.info(
            "Captured %d CUDA graphs in %.1f s (%d shapes failed and decode eagerly)",
            len(shapes) - failed,
            time.monotonic() - started,
            failed,
        )

    def compile_now(self) -> None:
        """Compile the step before the batch serves (compiled_step): one graph for one row,
        one for any other count, every width. Logged with what it cost."""
        started = time.monotonic()
        with self._torch.inference_mode():
            for rows in (1, 2):
                self._step(slice(0, rows), min(SHORTEST_WIDTH, self.row_tokens))
        logger.info("Compiled the decoding step in %.1f s", time.monotonic() - started)

    @property
    def failed_captures(self) -> int:
        return sum(captured is None for captured in self._graphs.values())

    def _replay(self, rows: int, width: int) -> torch.Tensor:
        """The step of `rows` rows over `width` columns, from its CUDA graph. Where its
        capture failed, that shape decodes eagerly."""
        captured = self._graph(rows, width)
        if captured is None:
            return self._forward(slice(0, rows), width)
        graph, logits = captured
        graph.replay()
        return logits

    def _graph(self, rows: int, width: int) -> tuple[Any, torch.Tensor] | None:
        """The captured step of this shape (captured here the first time); None where the
        capture failed."""
        key = (rows, width)
        if key not in self._graphs:
            try:
                with CAPTURING:
                    self._graphs[key] = self._capture(rows, width)
            except Exception:
                logger.warning(
                    "CUDA graph capture failed for %d rows x %d columns; decoding them eagerly", *key, exc_info=True
                )
                self._graphs[key] = None
        return self._graphs[key]

    def _capture(self, rows: int, width: int) -> tuple[Any, torch.Tensor]:
        """Capture the step of this shape as a CUDA graph. Running it several times is
        harmless: each run writes the same keys and values into the same columns."""
        torch = self._torch
        slots = slice(0, rows)
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # warm-up runs, as torch.cuda.graphs asks
            for _ in range(2):
                self._forward(slots, width)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        logits = capture(torch, graph, self._graph_pool, side, lambda: self._forward(slots, width))
        return graph, logits

    def _prefill_sparing(self, rows: list[_Row], finished: list[Finished]) -> tuple[list[_Row], torch.Tensor | None]:
        self._filled = len(self._rows)
        return super()._prefill_sparing(rows, finished)

    def _prefill(self, rows: list[_Row]) -> tuple[list[_Row], torch.Tensor]:
        filled = self._filled
        try:
            return super()._prefill(rows)
        except BaseException:
            self._filled = filled  # the slots it wrote are free again
            raise

    def _merge(self, rows: list[_Row], cache: Any, mask: torch.Tensor) -> None:
        """Copy the prefilled rows' keys and values into the next free slots, each row's
        real tokens first (the prefill's padding sits before or inside them)."""
        torch = self._torch
        start, stop = self._filled, self._filled + len(rows)
        if stop > self.capacity:
            raise RuntimeError(f"no free key/value slot: {self.capacity} are taken")
        width = mask.shape[1]
        # Per row, the columns of its real tokens in order, then the padding ones.
        order = torch.argsort((mask == 0).to(torch.int8), dim=1, stable=True)
        for layer, (keys, values) in enumerate(zip(self._keys, self._values, strict=True)):
            prefilled = cache.layers[layer]
            index = order[:, None, :, None].expand(-1, prefilled.keys.shape[1], -1, prefilled.keys.shape[3])
            keys[start:stop, :, :width] = prefilled.keys.gather(2, index)
            values[start:stop, :, :width] = prefilled.values.gather(2, index)
        for row, length in zip(rows, mask.sum(dim=1).tolist(), strict=True):
            row.cached = int(length)
        self._filled = stop

    def _row_kv(self, index: int) -> LayerKV:
        """A copy of the keys and values in the row's slot: its tokens, columns 0 to its length."""
        length = self._rows[index].cached
        return [
            (keys[index : index + 1, :, :length].clone(), values[index : index + 1, :, :length].clone())
            for keys, values in zip(self._keys, self._values, strict=True)
        ]

    def _drop_all_but(self, keep: list[int]) -> None:
        """Keep these rows in the first slots: each freed slot below the new end takes one
        row from beyond it (slot_moves), so a departure copies one row's tokens at most."""
        torch = self._torch
        moves = slot_moves(keep)
        rows = {slot: self._rows[slot] for slot in keep}
        for old, new in moves:
            rows[new] = rows.pop(old)
        if moves:
            old_slots = torch.tensor([old for old, _ in moves], device=self.device)
            new_slots = torch.tensor([new for _, new in moves], device=self.device)
            width = max(self._rows[old].cached for old, _ in moves)
            for tensors in (self._keys, self._values):
                for slots in tensors:
                    slots[new_slots, :, :width] = slots[old_slots, :, :width]
        self._rows = [rows[slot] for slot in range(len(keep))]
        self._filled = len(self._rows)


def compiled_step(
    step: Callable[[slice, int], torch.Tensor], *, freeze: bool = True
) -> Callable[[slice, int], torch.Tensor]:
    """`step` compiled by torch.compile's inductor (C++ on a CPU), with the weights frozen
    into the graph as constants (oneDNN's packed layouts for the matrix products) when
    `freeze`.

    Dynamic shapes: rows and width are symbols, so two graphs (one row, more rows) serve
    every step, compiled in about 50 s each on two cores; one graph per (rows, width)
    shape, as CUDA graphs have, would be 28 compiles of some 25 s at 8 rows. Measured
    on SmolLM2-135M in bfloat16, two cores (docs/benchmarks.md): a step of one row 22.4
    → 13.3 ms, of eight 26.0 → 19.7 ms. Weights quantized by torchao (CHAT_QUANTIZATION) are
    not frozen: int8's, folded into constants, were widened back to bfloat16 at every step
    (a whole answer at 0.70 of the unfrozen speed); int4's, measured unfrozen only, stay
    torchao's tensors too."""
    import torch

    return torch.compile(step, dynamic=True, options={"freezing": freeze})


def plain_weights(model: Any) -> bool:
    """Whether every weight is an ordinary tensor (not one of torchao's quantized ones)."""
    import torch

    return all(type(parameter) in (torch.nn.Parameter, torch.Tensor) for parameter in model.parameters())


def forget_compiled_steps() -> None:
    """Drop every compiled step of the process (torch.compile's caches keep each batch's
    graph, and with it the weights frozen in, after the batch is gone): after an unload.
    Another model's compiled step, if any, compiles again at its next step."""
    import torch

    torch.compiler.reset()


def capture(torch: Any, graph: Any, pool: Any, stream: Any, step: Callable[[], T]) -> T:
    """Capture `step()` into `graph` on `stream`, sharing `pool`; what it returned.

    What `torch.cuda.graph` does, except after a failure: when its `capture_end` raises
    (an invalidated capture: a host sync, an unsupported kernel) it leaves the capture
    stream current and the caching allocator still sending this thread's allocations to
    the graph's pool, so every later capture fails and the next `empty_cache()` raises.
    Here the stream context is exited whatever happens, and a failed capture's pool
    routing is ended and the graph reset before the error goes on."""
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):  # exited on any error: the previous stream is current again
        graph.capture_begin(pool=pool)
        try:
            result = step()
        finally:
            try:
                graph.capture_end()  # also ends the capture when step() raised in it
            except BaseException:
                # The stream's capture ended with the error; the allocator's routing did not.
                torch._C._cuda_endAllocateToPool(stream.device.index, graph.pool())
                graph.reset()
                raise
    return result


def step_widths(row_tokens: int) -> list[int]:
    """The widths a static step reads, in slots of `row_tokens` tokens: powers of two from
    SHORTEST_WIDTH, then the slots' whole width."""
    widths = []
    width = SHORTEST_WIDTH
    while width < row_tokens:
        widths.append(width)
        width *= 2
    return [*widths, row_tokens]


def static_shapes(capacity: int, row_tokens: int) -> list[tuple[int, int]]:
    """Every (rows, width) shape a static step of at most `capacity` rows in slots of
    `row_tokens` tokens runs at: each row bucket up to it, by each width (step_widths)."""
    buckets = [size for size in ROW_BUCKETS if size < capacity] + [capacity]
    return [(rows, width) for rows in buckets for width in step_widths(row_tokens)]


def slot_moves(keep: list[int]) -> list[tuple[int, int]]:
    """The (old, new) slot moves that pack the rows in slots `keep` into the first
    len(keep) slots: each row beyond that end moves into a freed slot below it, and no
    other row moves. (Shifting every later row down instead copied, at 256 rows of an
    8B model, some 22 GiB per departure.)"""
    end = len(keep)
    kept = set(keep)
    freed = [slot for slot in range(end) if slot not in kept]
    beyond = [slot for slot in keep if slot >= end]
    return list(zip(beyond, freed, strict=True))


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


def open_batch(
    generator: Generator,
    *,
    max_rows: int = 256,
    cuda_graphs: str = "0",
    row_tokens: int = 4096,
    compiled: bool = False,
    prefix_cache_bytes: int = 0,
) -> Batch:
    """An empty batch of the generator's model.

    `cuda_graphs` is GENERATION_CUDA_GRAPHS: `0` the dynamic path; `1` the static path,
    with CUDA graphs where the model is on CUDA (on a CPU it runs eagerly, as tested);
    `auto` the static path with graphs on CUDA, the dynamic path elsewhere.
    `compiled` (GENERATION_COMPILE): where the static path runs without graphs (a CPU),
    its step is compiled (compiled_step) before the batch serves.
    `prefix_cache_bytes` (GENERATION_PREFIX_CACHE_MB): the keys and values of finished
    sequences kept for prompts that begin the same way (PrefixCache)."""
    if isinstance(generator, SyntheticGenerator):
        return SyntheticBatch(generator)
    assert isinstance(generator, TransformersGenerator), f"{generator!r} cannot batch"
    if not wants_static(generator, cuda_graphs):
        return TransformersBatch(generator, prefix_cache_bytes=prefix_cache_bytes)
    on_cuda = generator.device.type == "cuda"
    if unsupported := static_unsupported(generator.model.config):
        logger.warning("GENERATION_CUDA_GRAPHS=%s: %s; decoding on the dynamic path", cuda_graphs, unsupported)
        return TransformersBatch(generator, prefix_cache_bytes=prefix_cache_bytes)
    if not on_cuda:
        logger.warning("GENERATION_CUDA_GRAPHS=1 on %s: static decoding without graphs", generator.device)
    batch = StaticBatch(
        generator,
        max_rows=max_rows,
        row_tokens=row_tokens,
        cuda_graphs=on_cuda,
        compiled=compiled,
        prefix_cache_bytes=prefix_cache_bytes,
    )
    if on_cuda:
        batch.capture_all()
    elif compiled:
        batch.compile_now()
    return batch


def wants_static(generator: Generator | None, cuda_graphs: str) -> bool:
    """Whether GENERATION_CUDA_GRAPHS asks for the static path for this generator (where
    the model allows it: static_unsupported)."""
    if not isinstance(generator, TransformersGenerator):
        return False
    return cuda_graphs == "1" or (cuda_graphs == "auto" and generator.device.type == "cuda")


def partial_attention(config: Any) -> str | None:
    """The model's kinds of layers where some don't attend to every earlier token (a
    sliding window's), else None."""
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    return None if kinds == {"full_attention"} else ", ".join(sorted(kinds))


def static_unsupported(config: Any) -> str | None:
    """Why the static path can't run this model, if it can't: its slots are plain causal
    attention over every earlier token, through a mask it builds itself, and its steps
    are captured as CUDA graphs."""
    if kinds := partial_attention(config):
        return f"its layers are {kinds}, not only full attention"
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in ("sdpa", "eager", CPU_DECODE_ATTENTION):  # the last takes sdpa's masks
        return f"its attention implementation is {implementation}, not sdpa or eager"
    quantization = getattr(config, "quantization_config", None)
    if quantization is not None and not isinstance(quantization, dict):
        quantization = quantization.to_dict()
    if quantization and quantization.get("load_in_8bit"):
        return "its weights are bitsandbytes 8-bit, whose matrix products wait on the host: no graph can hold them"
    return None
