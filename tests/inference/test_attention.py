"""A compiled decoding step's attention in bfloat16 on a CPU (inference.attention): what SDPA
computes, in two matrix products; everything else still SDPA's."""

from __future__ import annotations

import pytest
import torch
from django.conf import settings as django_settings
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from inference import attention
from inference.attention import CPU_DECODE_ATTENTION, decode_attention, grouped_attention
from inference.generators import load_generator
from inference.registry import resolve_model


class Layer(torch.nn.Module):
    """What the attention functions read off a model's attention layer."""

    num_key_value_groups = 3
    is_causal = True


def inputs(queries: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Four rows, nine query heads over three key/value heads, 17 keys; the mask as a batched
    step passes it: row 0 left-padded by five, row 3 by one."""
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(4, 9, queries, 64, generator=generator).to(dtype)
    key = torch.randn(4, 3, 17, 64, generator=generator).to(dtype)
    value = torch.randn(4, 3, 17, 64, generator=generator).to(dtype)
    mask = torch.ones(4, 1, queries, 17, dtype=torch.bool)
    mask[0, ..., :5] = False
    mask[3, ..., :1] = False
    return query, key, value, mask


def sdpa_in_float32(query, key, value, mask) -> torch.Tensor:
    """The reference: SDPA in float32 (the two round the same products to bfloat16 at different steps)."""
    return sdpa_attention_forward(Layer(), query.float(), key.float(), value.float(), mask, scaling=0.125)[0]


def test_grouped_attention_attends_as_sdpa_does():
    query, key, value, mask = inputs(1, torch.bfloat16)
    ours = grouped_attention(query, key, value, mask, 0.125)
    assert ours.shape == (4, 1, 9, 64)
    assert ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours.float(), sdpa_in_float32(query, key, value, mask), atol=0.02, rtol=0.02)


def test_a_masked_key_is_never_read():
    query, key, value, mask = inputs(1, torch.bfloat16)
    poisoned = value.clone()
    poisoned[0, :, :5] = 1e4  # row 0's padding
    assert torch.equal(
        grouped_attention(query, key, value, mask, 0.125), grouped_attention(query, key, poisoned, mask, 0.125)
    )


def test_a_compiled_decoding_step_in_bfloat16_takes_the_two_products(monkeypatch):
    taken = []
    monkeypatch.setattr(attention, "grouped_attention", lambda *args: taken.append(True) or grouped_attention(*args))
    query, key, value, mask = inputs(1, torch.bfloat16)
    torch.compiler.reset()  # a fresh trace, through the spy
    ours, weights = torch.compile(decode_attention, dynamic=False)(Layer(), query, key, value, mask, scaling=0.125)
    assert taken  # traced through it
    assert weights is None
    torch.testing.assert_close(ours.float(), sdpa_in_float32(query, key, value, mask), atol=0.02, rtol=0.02)


@pytest.mark.parametrize(
    ("queries", "dtype", "masked"),
    [(1, torch.bfloat16, True), (5, torch.bfloat16, True), (1, torch.float32, True), (1, torch.bfloat16, False)],
    ids=["an eager step", "a prompt's queries", "float32", "an additive mask"],
)
def test_everything_else_goes_to_sdpa_unchanged(queries, dtype, masked):
    query, key, value, mask = inputs(queries, dtype)
    if not masked:  # a float mask of additive biases: SDPA's to interpret
        mask = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
    ours, _ = decode_attention(Layer(), query, key, value, mask, scaling=0.125)
    expected, _ = sdpa_attention_forward(Layer(), query, key, value, mask, scaling=0.125)
    assert torch.equal(ours, expected)


@pytest.mark.parametrize(("dtype", "implementation"), [("bfloat16", CPU_DECODE_ATTENTION), ("float32", "sdpa")])
def test_a_model_takes_it_only_in_bfloat16(dtype, implementation):
    generator = load_generator(
        resolve_model("smollm2-135m-instruct"),
        cache_dir=django_settings.MODEL_CACHE_DIR,
        device="cpu",
        dtype=dtype,
        synthetic_tokens_per_s=50,
    )
    assert generator.model.config._attn_implementation == implementation
    ids = generator.encode([{"role": "user", "content": "Name a colour."}])
    with torch.inference_mode():
        answer = generator.model.generate(**ids, max_new_tokens=8, do_sample=False)
    assert answer.shape[1] > ids["input_ids"].shape[1]  # it decodes through it
