"""Attention for a model decoding in bfloat16 on a CPU: a decoding step's attention as two
matrix products, instead of torch's scaled_dot_product_attention.

Measured on two cores of an Intel Xeon without bfloat16 instructions (torch 2.13), one new
token for each of 8 rows, 9 query heads over 3 key/value heads of 64, the mask a step
passes: SDPA (its flash-attention kernel for CPUs) took 755 µs a layer over 200 tokens and
2,775 µs over 600, in bfloat16; the same arithmetic as two products and a float32 softmax
231 and 543 µs. A step of SmolLM2-135M in int4 spent 37 % of its time in SDPA. In float32
SDPA is the faster (209 µs), and with a prompt's many queries it is the one that does not
hold a queries-by-keys matrix per head, so only bfloat16 decoding steps take this path;
everything else goes to SDPA as before.

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
    """Attention of one new token per row in bfloat16 on a CPU as two products, each key/value
    head's query heads together (no copy of the keys per query head); anything else (a
    prompt's queries, float32, a soft cap, a mask of another kind) by SDPA."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, queries, dim = query.shape
    kv_heads = key.shape[1]
    if (
        queries != 1
        or query.dtype != torch.bfloat16
        or query.device.type != "cpu"
        or kwargs.get("softcap") is not None
        or (attention_mask is not None and (attention_mask.dtype != torch.bool or attention_mask.shape[1] != 1))
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    grouped = query.view(batch, kv_heads, heads // kv_heads, dim)  # query head h reads key head h // groups
    scores = torch.matmul(grouped, key.transpose(2, 3)) * (dim**-0.5 if scaling is None else scaling)
    if attention_mask is not None:  # (batch, 1, 1, keys): True where a row may look
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    output = torch.matmul(weights, value).view(batch, heads, 1, dim)
    return output.transpose(1, 2).contiguous(), None


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
