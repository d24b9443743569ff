"""CHAT_QUANTIZATION=int4's linear layers: the 4-bit weights for a few rows, dense ones for
many.

PyTorch's CPU int4 kernel (`_weight_int4pack_mm_for_cpu`) costs time in proportion to the
rows it multiplies; a dense product costs far less per row once there are many. Decoding
multiplies one row per stream and wins in 4 bits; a prompt multiplies one row per token and
lost: eight prompts joining took 319 ms in int4 against 142 ms in bfloat16 on an Intel
Xeon with AMX (a scratch measurement). On an AMD EPYC with AVX2 only, 256 rows through a
576x1536 layer took 10.9 ms in int4 and 5.4 ms in float32 (bfloat16 is emulated there,
slower than either).

So each layer keeps a dense copy of its weight, bfloat16 where the CPU has bfloat16
instructions and float32 elsewhere, and uses it from a number of rows measured on this CPU
per weight shape when the model loads. A shape where the dense copy never clearly wins
keeps int4 alone. The copies cost memory: docs/deployment.md gives the figures.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

# Row counts the crossover is measured at; above the largest, the dense product is assumed
# to stay ahead (the int4 kernel's time keeps growing with rows, the dense one's barely).
CALIBRATION_ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
# The dense weight is used only where it takes at most this share of the int4 time: a tie
# goes to int4, which reads a quarter of bfloat16's bytes (an eighth of float32's).
DENSE_MARGIN = 0.9
# Dense bytes timed in a pass, layer after layer: more than a CPU's caches hold (32 MiB of
# L3 here), as in a forward pass, where the dense weights come from memory. Timed with the
# first 8 layers only, the attention's float32 copies came from the cache and won from 8
# rows, where a whole forward pass of 8 rows was no faster with them.
MEASURED_BYTES = 128 * 2**20


class Int4Linear(torch.nn.Linear):
    """A linear layer whose `weight` torchao has packed in 4 bits, with a dense copy of it
    (bfloat16 or float32) in `dense_weight` for inputs of at least `dense_from_rows` rows;
    both None where the copy never pays."""

    dense_weight: torch.Tensor | None
    dense_from_rows: int | None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        rows = input.numel() // self.in_features
        if self.dense_weight is not None and rows >= self.dense_from_rows:  # type: ignore[operator]
            dtype = self.dense_weight.dtype  # float32 on a CPU without bfloat16 instructions
            bias = None if self.bias is None else self.bias.to(dtype)
            return F.linear(input.to(dtype), self.dense_weight, bias).to(input.dtype)
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, dense_from_rows={self.dense_from_rows}"


@contextmanager
def int4_only(model: torch.nn.Module) -> Iterator[None]:
    """Every Int4Linear of `model` multiplies in int4 inside the block, whatever the rows: to
    measure int4's own answers with whole forward passes (bench.quantization, the tests)."""
    layers = [module for module in model.modules() if isinstance(module, Int4Linear)]
    crossovers = [layer.dense_from_rows for layer in layers]
    for layer in layers:
        layer.dense_from_rows = sys.maxsize
    try:
        yield
    finally:
        for layer, crossover in zip(layers, crossovers, strict=True):
            layer.dense_from_rows = crossover


def dense_from_rows(
    time_at: Callable[[int], tuple[float, float]],
    rows_to_try: Iterable[int] = CALIBRATION_ROWS,
    margin: float = DENSE_MARGIN,
) -> int | None:
    """The fewest rows from which the dense weight is clearly faster at every count tried;
    None when it is not at the largest. `time_at(rows)` gives (int4 seconds, dense seconds).

    It walks down from the largest count and stops at the first the dense weight loses:
    where it never wins, only one count is timed."""
    chosen = None
    for rows in sorted(rows_to_try, reverse=True):
        int4_seconds, dense_seconds = time_at(rows)
        if dense_seconds > margin * int4_seconds:
            break
        chosen = rows
    return chosen


def keep_dense_weights(
    model: torch.nn.Module, weights: Mapping[torch.nn.Module, torch.Tensor], dense_dtype: torch.dtype
) -> None:
    """Turn each linear layer in `weights` (quantized to int4, with its weight from before)
    into an Int4Linear, with a copy of that weight in `dense_dtype` (bfloat16 where the CPU
    has bfloat16 instructions, float32 elsewhere) used from the crossover measured here for
    its shape, or without one where there is none."""
    by_shape: dict[tuple[int, ...], list[torch.nn.Module]] = defaultdict(list)
    for module in weights:
        by_shape[tuple(weights[module].shape)].append(module)
    started = time.perf_counter()
    for shape, modules in by_shape.items():
        dense = [weights[module].to(dense_dtype) for module in modules]
        crossover = dense_from_rows(lambda rows: measure(modules, dense, rows))  # noqa: B023 (called here)
        for module, weight in zip(modules, dense, strict=True):
            module.__class__ = Int4Linear
            assert isinstance(module, Int4Linear)
            module.dense_from_rows = crossover
            module.register_buffer("dense_weight", weight if crossover else None, persistent=False)
        logger.info(
            "int4: %d layers of %dx%d multiply in %s from %s rows",
            len(modules),
            shape[1],
            shape[0],
            str(dense_dtype).removeprefix("torch."),
            crossover if crossover else "no number of",
        )
    logger.info(
        "int4: crossovers measured in %.1f s; dense copies take %.0f MiB",
        time.perf_counter() - started,
        dense_copy_bytes(model) / 2**20,
    )


def dense_copy_bytes(model: torch.nn.Module) -> int:
    """Bytes the dense copies of `model`'s Int4Linear layers hold beyond its parameters: a
    tied output layer's bfloat16 copy is the embedding itself and costs nothing; any other
    copy does, a bfloat16 one too (the weight it keeps would have been freed)."""
    parameters = {parameter.data_ptr() for parameter in model.parameters() if type(parameter) is torch.nn.Parameter}
    copies = [module.dense_weight for module in model.modules() if isinstance(module, Int4Linear)]
    return sum(copy.nbytes for copy in copies if copy is not None and copy.data_ptr() not in parameters)


def measure(modules: list[torch.nn.Module], dense: list[torch.Tensor], rows: int) -> tuple[float, float]:
    """Seconds for one product of `rows` bfloat16 rows through layers of `modules`, in
    int4 and with its `dense` weight (as Int4Linear.forward does it): the best of three
    passes. A pass goes through as many of the layers as make MEASURED_BYTES of dense
    weights, or all of them."""
    layers = min(len(modules), max(1, math.ceil(MEASURED_BYTES / dense[0].nbytes)))

    def best_of_three(product: Callable[[int], torch.Tensor]) -> float:
        product(0)  # the first call sets up oneDNN's kernel
        times = []
        for _ in range(3):
            started = time.perf_counter()
            for index in range(layers):
                product(index)
            times.append(time.perf_counter() - started)
        return min(times)

    input = torch.randn(rows, dense[0].shape[1], dtype=torch.bfloat16)
    with torch.inference_mode():
        return (
            best_of_three(lambda index: F.linear(input, modules[index].weight)),  # type: ignore[arg-type]
            best_of_three(lambda index: F.linear(input.to(dense[index].dtype), dense[index]).to(input.dtype)),
        )
