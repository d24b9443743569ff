"""Attention for a model decoding in bfloat16 on a CPU with a compiled step
(GENERATION_COMPILE): a decoding step's attention as two matrix products.

Compiled, transformers' SDPA attention can't take its eager shortcut for one new token per
row (folding each key/value head's query heads into one: `pack_gqa`, skipped while
dynamo traces): it copies every key/value head once per query head it serves
(`repeat_kv`) and runs torch's SDPA kernel over them. Measured on two cores of an Intel
Xeon without bfloat16 instructions, SmolLM2-135M in int4 (9 query heads over 3 key/value
heads), the static path compiled, 128 steps from a prompt (`bench.batch_step --path
compiled` against `--sdpa`): a step of 8 rows 48.6 ms with SDPA, 34.7 ms with the two
products here; of one row 15.4 against 16.0 ms. Eagerly SDPA's own path is the faster
(the dynamic path, `bench.batch_step` against `--sdpa`: one row 23.1 against 26.4 ms, 8
rows 43.3 against 47.2 ms), so everything but a compiled bfloat16 decoding step still
goes to SDPA.

A model takes it by its attention implementation's name (`CPU_DECODE_ATTENTION`),
registered with transformers' attention and mask interfaces (`AttentionInterface`), which
the model's layers look up at every call: `use_cpu_decode_attention` sets it on a loaded
model in place of `sdpa`. Masks are built as for SDPA (booleans).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch and transformers load with the model (inference.loading), not on import
    import torch

CPU_DECODE_ATTENTION = "chatsite_cpu_decode"


def grouped_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None, scaling: float
) -> torch.Tensor:
    """One new token per row: each key/value head's query heads together (no copy of the keys),
    scores in the model's dtype, softmax in float32 as transformers' eager attention does.
    `attention_mask`: booleans (rows, 1, 1, keys), True where a row may look. Returns
    (rows, 1, heads, dim), as attention functions do."""
    import torch

    batch, heads, _, dim = query.shape
    grouped = query.view(batch, key.shape[1], -1, dim)  # query head h reads key head h // groups
    scores = torch.matmul(grouped, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value).view(batch, heads, 1, dim).transpose(1, 2).contiguous()


def decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A compiled decoding step in bfloat16 on a CPU by grouped_attention; anything else (eager
    steps, a prompt's queries, float32, a soft cap, a mask of another kind) by SDPA."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if (
        torch.compiler.is_compiling()
        and query.shape[2] == 1
        and query.dtype == torch.bfloat16
        and query.device.type == "cpu"
        and kwargs.get("softcap") is None
        and (attention_mask is None or (attention_mask.dtype == torch.bool and attention_mask.shape[1] == 1))
    ):
        return grouped_attention(
            query, key, value, attention_mask, query.shape[-1] ** -0.5 if scaling is None else scaling
        ), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def use_cpu_decode_attention(model: Any) -> None:
    """Give a model loaded in bfloat16 on a CPU with SDPA attention the decoding steps'
    attention of this module; any other model is left as it is."""
    import torch
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if model.device.type == "cpu" and model.dtype == torch.bfloat16 and model.config._attn_implementation == "sdpa":
        AttentionInterface.register(CPU_DECODE_ATTENTION, decode_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(CPU_DECODE_ATTENTION, sdpa_mask)
        model.set_attn_implementation(CPU_DECODE_ATTENTION)
