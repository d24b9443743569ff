"""CHAT_QUANTIZATION=int4's layers: 4-bit weights for few rows, dense copies from a
crossover measured on the CPU at load (inference.int4)."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from inference.int4 import Int4Linear, dense_copy_bytes, dense_from_rows, int4_only, keep_dense_weights
from inference.loading import INT4_GROUP_SIZE

pytest.importorskip("torchao")


def crossover(timings: dict[int, tuple[float, float]]) -> int | None:
    return dense_from_rows(timings.__getitem__, rows_to_try=timings)


def test_the_crossover_is_the_fewest_rows_from_which_dense_wins_at_every_count():
    timings = {1: (1.0, 3.0), 4: (2.0, 3.0), 16: (8.0, 3.0), 64: (32.0, 4.0), 256: (128.0, 6.0)}
    assert crossover(timings) == 16


def test_a_dense_win_below_a_loss_does_not_count():
    assert crossover({1: (1.0, 0.5), 4: (2.0, 3.0), 16: (8.0, 3.0)}) == 16


def test_a_tie_or_a_near_tie_goes_to_int4():
    assert crossover({8: (1.0, 1.0), 16: (1.0, 0.95)}) is None
    assert crossover({8: (1.0, 0.95), 16: (1.0, 0.85)}) == 16


def test_where_dense_loses_at_the_most_rows_only_that_count_is_timed():
    timed = []

    def time_at(rows):
        timed.append(rows)
        return (1.0, 2.0)

    assert dense_from_rows(time_at) is None
    assert timed == [128]


def quantized_layers(count: int = 3, shape: tuple[int, int] = (64, 128)) -> tuple[torch.nn.Module, dict]:
    from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig
    from torchao.quantization import quantize_

    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(shape[1], shape[0], bias=False) for _ in range(count)))
    model.to(torch.bfloat16)
    weights = {module: module.weight.detach() for module in model}
    quantize_(model, PrototypeInt4WeightOnlyConfig(group_size=INT4_GROUP_SIZE, set_inductor_config=False))
    return model, weights


def test_an_int4_layer_multiplies_few_rows_in_int4_and_many_with_its_bfloat16_weight():
    model, weights = quantized_layers(count=1)
    layer = model[0]
    int4_output = {rows: F.linear(torch.ones(rows, 128, dtype=torch.bfloat16), layer.weight) for rows in (2, 8)}
    layer.__class__ = Int4Linear
    layer.dense_from_rows = 8
    layer.register_buffer("dense_weight", weights[layer], persistent=False)

    with torch.inference_mode():
        few = layer(torch.ones(1, 2, 128, dtype=torch.bfloat16))  # a batch of 1 row of 2 tokens: 2 rows
        many = layer(torch.ones(2, 4, 128, dtype=torch.bfloat16))
    assert torch.equal(few[0], int4_output[2])
    assert torch.equal(many.reshape(8, 64), F.linear(torch.ones(8, 128, dtype=torch.bfloat16), weights[layer]))
    assert not torch.equal(many.reshape(8, 64), int4_output[8])  # the two weights do differ


def test_keeping_dense_weights_measures_each_shape_once_and_applies_its_crossover(monkeypatch, caplog):
    model, weights = quantized_layers()
    measured = []

    timings = {1: (1.0, 2.0), 32: (2.0, 2.0), 64: (4.0, 1.0), 128: (8.0, 1.5), 256: (16.0, 2.0)}

    def measure(modules, dense, rows):
        measured.append((len(modules), rows))
        return timings.get(rows, (1.0, 2.0))

    monkeypatch.setattr("inference.int4.measure", measure)
    with caplog.at_level(logging.INFO, logger="inference.int4"):
        keep_dense_weights(model, weights, torch.bfloat16)

    assert measured == [(3, 128), (3, 64), (3, 32)]
    for layer in model:
        assert isinstance(layer, Int4Linear)
        assert layer.dense_from_rows == 64
        assert layer.dense_weight is weights[layer]  # already bfloat16: no copy
        assert "dense_weight" not in layer.state_dict()  # not saved with the model
    assert dense_copy_bytes(model) == 3 * 64 * 128 * 2  # the weights it keeps, freed otherwise
    assert "3 layers of 128x64 multiply in bfloat16 from 64 rows" in caplog.text


def test_where_bfloat16_never_wins_the_bfloat16_weights_are_let_go(monkeypatch, caplog):
    model, weights = quantized_layers()
    monkeypatch.setattr("inference.int4.measure", lambda modules, dense, rows: (16.0, 17.0))
    with caplog.at_level(logging.INFO, logger="inference.int4"):
        keep_dense_weights(model, weights, torch.bfloat16)

    for layer in model:
        assert layer.dense_from_rows is None and layer.dense_weight is None
        assert layer(torch.ones(300, 128, dtype=torch.bfloat16)).shape == (300, 64)  # in int4
    assert "multiply in bfloat16 from no number of rows" in caplog.text


def test_float32_copies_for_a_cpu_without_bfloat16_instructions_take_and_give_bfloat16(monkeypatch):
    model, weights = quantized_layers()
    monkeypatch.setattr("inference.int4.measure", lambda modules, dense, rows: (2.0, 1.0))
    keep_dense_weights(model, weights, torch.float32)

    layer = model[0]
    assert layer.dense_from_rows == 1 and layer.dense_weight.dtype == torch.float32
    input = torch.randn(4, 128, dtype=torch.bfloat16)
    with torch.inference_mode():
        output = layer(input)
    assert output.dtype == torch.bfloat16
    assert torch.equal(output, F.linear(input.float(), weights[layer].float()).to(torch.bfloat16))


def test_the_measurement_times_both_products():
    from inference.int4 import measure

    model, weights = quantized_layers()
    int4_seconds, dense_seconds = measure(list(model), [weights[layer] for layer in model], 16)
    assert int4_seconds > 0 and dense_seconds > 0


def test_inside_int4_only_every_layer_multiplies_in_int4_and_after_it_as_before(monkeypatch):
    model, weights = quantized_layers(count=1)
    monkeypatch.setattr("inference.int4.measure", lambda modules, dense, rows: (2.0, 1.0))
    keep_dense_weights(model, weights, torch.bfloat16)
    input = torch.randn(4, 128, dtype=torch.bfloat16)

    with torch.inference_mode():
        with int4_only(model):
            assert torch.equal(model(input), F.linear(input, model[0].weight))
        assert torch.equal(model(input), F.linear(input, weights[model[0]]))
    assert model[0].dense_from_rows == 1
