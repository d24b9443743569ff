"""CHAT_QUANTIZATION=int8: torchao's weight-only int8 on the packaged model, on a CPU."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from django.conf import settings as django_settings
from django.test import override_settings

from generation.checks import model_settings_check
from inference.batching import Sequence, StaticBatch, open_batch
from inference.generators import GenerationParams, load_generator
from inference.loading import quantize_weights
from inference.registry import resolve_model

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "Why is the sky blue?"]


def chat(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


@pytest.fixture(scope="module")
def smollm_int8():
    """The packaged model in float32 as CHAT_QUANTIZATION=int8 loads it."""
    return load_generator(
        resolve_model("smollm2-135m-instruct"),
        cache_dir=django_settings.MODEL_CACHE_DIR,
        device="cpu",
        dtype="float32",
        synthetic_tokens_per_s=50,
        quantization="int8",
    )


def test_every_linear_layer_holds_its_weights_in_int8_with_a_scale_per_row(smollm_int8):
    from torchao.quantization import Int8Tensor

    linears = [module for module in smollm_int8.model.modules() if isinstance(module, torch.nn.Linear)]
    assert len(linears) == 30 * 7 + 1  # seven per layer, and the output head
    for linear in linears:
        assert isinstance(linear.weight, Int8Tensor)
        assert linear.weight.qdata.dtype == torch.int8
        assert linear.weight.scale.numel() == linear.out_features


def test_int8_picks_the_unquantized_models_next_token_almost_everywhere(smollm, smollm_int8):
    """Teacher-forced along the unquantized model's greedy answers: one forward pass each,
    so one early difference does not count against every later token (bench.quantization
    measures the same over 16 prompts: docs/benchmarks.md)."""
    agreed = total = 0
    for prompt in PROMPTS:
        ids = smollm.encode(chat(prompt))
        with torch.inference_mode():
            answer = smollm.model.generate(**ids, max_new_tokens=24, min_new_tokens=24, do_sample=False)
            logits = smollm_int8.model(answer).logits[0, ids["input_ids"].shape[1] - 1 : -1]
        expected = answer[0, ids["input_ids"].shape[1] :]
        agreed += int((logits.argmax(-1) == expected).sum())
        total += expected.numel()
    assert agreed / total >= 0.9


def test_the_static_path_with_int8_weights_answers_like_generate_does(smollm_int8):
    greedy = GenerationParams(max_tokens=12, temperature=0)
    expected = {}
    for prompt in PROMPTS:
        pieces: list[str] = []
        smollm_int8.generate(chat(prompt), greedy, pieces.append, lambda: False)
        expected[prompt] = "".join(pieces)
    batch = open_batch(smollm_int8, max_rows=4, cuda_graphs="1", row_tokens=128)
    assert isinstance(batch, StaticBatch)
    answers: dict[str, list[str]] = {prompt: [] for prompt in PROMPTS}
    for prompt in PROMPTS:
        batch.add(Sequence(chat(prompt), greedy, answers[prompt].append, lambda: False))
    while len(batch):
        batch.step()

    assert {prompt: "".join(pieces) for prompt, pieces in answers.items()} == expected


def test_int8_without_torchao_is_refused_naming_the_package(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "torchao" else find_spec(name, *a))
    with pytest.raises(RuntimeError, match="CHAT_QUANTIZATION=int8 needs the torchao package"):
        quantize_weights(torch.nn.Linear(4, 4), "int8")
    with override_settings(CHAT_QUANTIZATION="int8"):
        errors = model_settings_check()
    assert [error.id for error in errors] == ["chatsite.E002"]
    assert "torchao" in errors[0].msg


def test_other_settings_leave_the_weights_alone():
    linear = torch.nn.Linear(4, 4)
    weight = linear.weight
    for setting in ("none", "bnb-4bit", "bnb-8bit"):  # bitsandbytes quantizes while loading instead
        quantize_weights(linear, setting)
    assert linear.weight is weight
