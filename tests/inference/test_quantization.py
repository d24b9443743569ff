"""CHAT_QUANTIZATION=int8 and int4: torchao's weight-only quantization of the packaged
model, on a CPU."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from django.conf import settings as django_settings
from django.test import override_settings

from generation.checks import model_settings_check
from inference.batching import Sequence, StaticBatch, open_batch
from inference.generators import GenerationParams, TransformersGenerator, load_generator
from inference.int4 import dense_copy_bytes, int4_only
from inference.loading import INT4_GROUP_SIZE, cpu_has_native_bf16, quantize_weights
from inference.registry import resolve_model

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "Why is the sky blue?"]
# Each setting in the dtype the tests load it in: int8 in float32 (where a batched row computes
# exactly what it would alone), int4 in bfloat16, the only dtype it computes in.
DTYPES = {"int8": "float32", "int4": "auto"}
# The least share of the unquantized model's next tokens each keeps (bench.quantization
# measures both over 16 prompts: docs/benchmarks.md).
LEAST_AGREEMENT = {"int8": 0.9, "int4": 0.75}


def chat(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def load_quantized(setting: str) -> TransformersGenerator:
    """The packaged model as CHAT_QUANTIZATION=`setting` loads it."""
    generator = load_generator(
        resolve_model("smollm2-135m-instruct"),
        cache_dir=django_settings.MODEL_CACHE_DIR,
        device="cpu",
        dtype=DTYPES[setting],
        synthetic_tokens_per_s=50,
        quantization=setting,
    )
    assert isinstance(generator, TransformersGenerator)
    return generator


@pytest.fixture(scope="module")
def smollm_int8() -> TransformersGenerator:
    return load_quantized("int8")


@pytest.fixture(scope="module")
def smollm_int4() -> TransformersGenerator:
    return load_quantized("int4")


def linear_layers(generator: TransformersGenerator) -> list[torch.nn.Linear]:
    linears = [module for module in generator.model.modules() if isinstance(module, torch.nn.Linear)]
    assert len(linears) == 30 * 7 + 1  # seven per layer, and the output head
    return linears


def test_int8_holds_every_linear_layers_weights_in_int8_with_a_scale_per_row(smollm_int8):
    from torchao.quantization import Int8Tensor

    for linear in linear_layers(smollm_int8):
        assert isinstance(linear.weight, Int8Tensor)
        assert linear.weight.qdata.dtype == torch.int8
        assert linear.weight.scale.numel() == linear.out_features


def test_int4_holds_every_linear_layers_weights_in_four_bits_a_group_of_32_in_bfloat16(smollm_int4):
    from torchao.prototype.quantization.int4 import Int4OpaqueTensor

    assert smollm_int4.model.dtype == torch.bfloat16
    for linear in linear_layers(smollm_int4):
        assert isinstance(linear.weight, Int4OpaqueTensor)
        assert list(linear.weight.block_size) == [1, INT4_GROUP_SIZE]
        assert linear.weight.qdata.numel() == linear.in_features * linear.out_features // 2  # two a byte


def test_int4_layers_keep_dense_weights_only_where_they_pay_in_the_cpus_fast_dtype(smollm_int4):
    from inference.int4 import Int4Linear

    model = smollm_int4.model
    dense_dtype = torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    for linear in linear_layers(smollm_int4):
        assert isinstance(linear, Int4Linear)
        assert (linear.dense_weight is None) == (linear.dense_from_rows is None)
        assert linear.dense_weight is None or linear.dense_weight.dtype == dense_dtype
    head = model.lm_head.dense_weight
    if head is not None and head.dtype == torch.bfloat16:  # tied: the embedding's own tensor
        assert model.lm_head.dense_weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    copies = [linear.dense_weight for linear in linear_layers(smollm_int4) if linear.dense_weight is not None]
    free = head is not None and head.dtype == torch.bfloat16
    assert dense_copy_bytes(model) == sum(copy.nbytes for copy in copies) - (free and head.nbytes)


@pytest.mark.parametrize("setting", ["int8", "int4"])
def test_quantized_weights_pick_the_unquantized_models_next_token_almost_everywhere(smollm, setting, request):
    """Teacher-forced along the unquantized model's (float32) greedy answers: one forward
    pass each, so one early difference does not count against every later token."""
    quantized = request.getfixturevalue(f"smollm_{setting}")
    agreed = total = 0
    for prompt in PROMPTS:
        ids = smollm.encode(chat(prompt))
        with torch.inference_mode():
            answer = smollm.model.generate(**ids, max_new_tokens=24, min_new_tokens=24, do_sample=False)
            with int4_only(quantized.model):  # no dense copies: int4's answers, as when decoding
                logits = quantized.model(answer).logits[0, ids["input_ids"].shape[1] - 1 : -1]
        expected = answer[0, ids["input_ids"].shape[1] :]
        agreed += int((logits.argmax(-1) == expected).sum())
        total += expected.numel()
    assert agreed / total >= LEAST_AGREEMENT[setting]


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


@pytest.mark.parametrize("cuda_graphs", ["0", "1"])
def test_a_batch_with_int4_weights_decodes_what_the_model_itself_predicts(smollm_int4, cuda_graphs):
    """Both batch paths, each row's tokens checked against the model's own forward pass over
    the same tokens. In bfloat16 a batch's rounding differs from a whole pass's (by its shape,
    and its decoding steps' attention: inference.attention), so a near tie may go the other
    way: every token is among the pass's three likeliest, and most are its first."""
    greedy = GenerationParams(max_tokens=12, temperature=0)
    batch = open_batch(smollm_int4, max_rows=4, cuda_graphs=cuda_graphs, row_tokens=128)
    chosen: dict[str, list[int]] = {prompt: [] for prompt in PROMPTS}
    advance = batch._advance

    def recording(row, token_id):
        chosen[row.sequence.prompt[0]["content"]].append(token_id)
        advance(row, token_id)

    batch._advance = recording
    # int4 throughout, batch and whole pass alike: with the dense copies the whole pass would
    # compute with other weights than the decoding steps, from a crossover that varies by load.
    with int4_only(smollm_int4.model):
        for prompt in PROMPTS:
            batch.add(Sequence(chat(prompt), greedy, lambda text: None, lambda: False))
        while len(batch):
            batch.step()

    first = total = 0
    for prompt, answer in chosen.items():
        ids = smollm_int4.encode(chat(prompt))["input_ids"]
        with torch.inference_mode(), int4_only(smollm_int4.model):
            logits = smollm_int4.model(torch.cat([ids, torch.tensor([answer])], dim=1)).logits
        likeliest = logits[0, ids.shape[1] - 1 : -1].topk(3).indices
        tokens = torch.tensor(answer)[:, None]
        assert (likeliest == tokens).any(dim=1).all(), prompt
        first += int((likeliest[:, 0] == tokens[:, 0]).sum())
        total += len(answer)
    assert total >= 3 * 8
    assert first / total >= 0.8


def test_int4_is_refused_in_float32_naming_what_to_set(smollm):
    with pytest.raises(RuntimeError, match=r"CHAT_QUANTIZATION=int4 runs on a CPU in bfloat16.*CHAT_DTYPE=auto"):
        quantize_weights(smollm.model, "int4")
    assert type(smollm.model.lm_head.weight) is torch.nn.Parameter  # left as it was


@pytest.mark.parametrize(
    ("device", "dtype", "refused"),
    [("cpu", "float32", True), ("auto", "float16", True), ("cuda", "auto", True), ("auto", "auto", False)],
)
def test_the_start_up_check_refuses_int4_where_it_cannot_run(device, dtype, refused):
    with override_settings(CHAT_QUANTIZATION="int4", CHAT_DEVICE=device, CHAT_DTYPE=dtype):
        errors = model_settings_check()
    assert [error.id for error in errors] == ["chatsite.E004"] * refused
    if refused:
        assert f"CHAT_DEVICE={device} and CHAT_DTYPE={dtype}" in errors[0].msg


@pytest.mark.parametrize("setting", ["int8", "int4"])
def test_quantizing_without_torchao_is_refused_naming_the_package(monkeypatch, setting):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "torchao" else find_spec(name, *a))
    with pytest.raises(RuntimeError, match=f"CHAT_QUANTIZATION={setting} needs the torchao package"):
        quantize_weights(torch.nn.Linear(4, 4), setting)
    with override_settings(CHAT_QUANTIZATION=setting):
        errors = model_settings_check()
    assert [error.id for error in errors] == ["chatsite.E002"]
    assert "torchao" in errors[0].msg


def test_other_settings_leave_the_weights_alone():
    linear = torch.nn.Linear(4, 4)
    weight = linear.weight
    for setting in ("none", "bnb-4bit", "bnb-8bit"):  # bitsandbytes quantizes while loading instead
        quantize_weights(linear, setting)
    assert linear.weight is weight
