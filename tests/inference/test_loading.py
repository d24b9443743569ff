from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from inference.generators import GenerationParams, TransformersGenerator
from inference.loading import (
    COMPLETE_MARKER,
    cached_conversion,
    file_sha256,
    load_pretrained,
    quantization_config,
    resolve_device,
)
from inference.registry import SYNTHETIC, UnknownModel, available_models, resolve_model


def build_tiny_model(source: Path, target: Path) -> None:
    """A 'conversion' that builds a tiny random Llama and a word-level tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    spec = json.loads(source.read_text())
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=spec["vocab"],
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
        tie_word_embeddings=spec.get("tied", False),
    )
    LlamaForCausalLM(config).save_pretrained(target)
    vocab = {"<s>": 0, "</s>": 1, **{f"w{i}": i for i in range(2, spec["vocab"])}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="</s>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="</s>")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    tokenizer.save_pretrained(target)


@pytest.fixture
def source(tmp_path) -> Path:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({"vocab": 32}))
    return path


class CountingConvert:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, source: Path, target: Path) -> None:
        self.calls += 1
        build_tiny_model(source, target)


def load_cpu(model_dir: Path):
    return load_pretrained(model_dir, torch.device("cpu"))


def test_cache_miss_converts_into_a_folder_named_by_sha256(source, tmp_path):
    convert = CountingConvert()
    model, tokenizer = cached_conversion(source, tmp_path / "cache", convert, load_cpu)
    entry = tmp_path / "cache" / file_sha256(source)
    assert convert.calls == 1
    assert (entry / COMPLETE_MARKER).exists()
    assert (entry / "model.safetensors").exists()
    assert model.config.hidden_size == 16
    assert tokenizer.eos_token == "</s>"


def test_cache_hit_loads_without_converting(source, tmp_path):
    convert = CountingConvert()
    cached_conversion(source, tmp_path / "cache", convert, load_cpu)
    model, _ = cached_conversion(source, tmp_path / "cache", convert, load_cpu)
    assert convert.calls == 1
    assert model.config.num_hidden_layers == 1


def test_corrupted_cache_is_rebuilt(source, tmp_path):
    convert = CountingConvert()
    cached_conversion(source, tmp_path / "cache", convert, load_cpu)
    weights = tmp_path / "cache" / file_sha256(source) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])

    model, _ = cached_conversion(source, tmp_path / "cache", convert, load_cpu)

    assert convert.calls == 2
    assert model.config.hidden_size == 16


def test_conversion_interrupted_before_its_marker_is_redone(source, tmp_path):
    convert = CountingConvert()
    cached_conversion(source, tmp_path / "cache", convert, load_cpu)
    (tmp_path / "cache" / file_sha256(source) / COMPLETE_MARKER).unlink()
    cached_conversion(source, tmp_path / "cache", convert, load_cpu)
    assert convert.calls == 2


def test_changed_source_gets_its_own_cache_entry(source, tmp_path):
    convert = CountingConvert()
    cached_conversion(source, tmp_path / "cache", convert, load_cpu)
    source.write_text(json.dumps({"vocab": 40}))
    model, _ = cached_conversion(source, tmp_path / "cache", convert, load_cpu)
    assert convert.calls == 2
    assert model.config.vocab_size == 40


def test_tiny_model_generates_through_the_transformers_generator(source, tmp_path):
    model, tokenizer = cached_conversion(source, tmp_path / "cache", CountingConvert(), load_cpu)
    generator = TransformersGenerator("tiny", model, tokenizer)
    pieces: list[str] = []
    outcome = generator.generate(
        [{"role": "user", "content": "w2 w3"}],
        GenerationParams(max_tokens=5, temperature=0),
        pieces.append,
        lambda: False,
    )
    assert outcome.completion_tokens >= 1
    assert outcome.prompt_tokens == 2
    assert outcome.finish_reason in {"stop", "length"}


def test_auto_device_is_cpu_without_cuda():
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA refusal")
def test_asking_for_cuda_without_it_is_refused():
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        resolve_device("cuda:0")


def test_quantizing_on_a_cpu_is_refused_naming_the_setting(source, tmp_path):
    model_dir = tmp_path / "tiny"
    build_tiny_model(source, model_dir)
    with pytest.raises(RuntimeError, match=r"CHAT_QUANTIZATION=bnb-4bit needs a CUDA device"):
        load_pretrained(model_dir, torch.device("cpu"), "float32", "bnb-4bit")
    assert quantization_config("none", torch.device("cpu"), torch.float32) is None


def test_quantizing_without_bitsandbytes_is_refused_naming_the_package(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match="CHAT_QUANTIZATION=bnb-8bit needs the bitsandbytes package"):
        quantization_config("bnb-8bit", torch.device("cuda"), torch.bfloat16)


def test_quantization_settings_become_bitsandbytes_configurations(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object())  # as if installed
    four = quantization_config("bnb-4bit", torch.device("cuda"), torch.bfloat16)
    assert four.load_in_4bit
    assert four.bnb_4bit_quant_type == "nf4"
    assert four.bnb_4bit_use_double_quant
    assert four.bnb_4bit_compute_dtype == torch.bfloat16
    eight = quantization_config("bnb-8bit", torch.device("cuda:1"), torch.bfloat16)
    assert eight.load_in_8bit
    assert not eight.load_in_4bit
    with pytest.raises(ValueError, match="bnb-2bit"):
        quantization_config("bnb-2bit", torch.device("cuda"), torch.bfloat16)


def test_registry_resolves_names_paths_and_hub_ids(tmp_path):
    assert resolve_model("smollm2-135m-instruct").gguf_parts[0].locate() is not None
    assert resolve_model(str(tmp_path)).source == str(tmp_path.resolve())
    assert resolve_model("HuggingFaceTB/SmolLM2-360M-Instruct").source == "HuggingFaceTB/SmolLM2-360M-Instruct"
    with pytest.raises(UnknownModel):
        resolve_model("no-such-model")
    with pytest.raises(UnknownModel):
        resolve_model(SYNTHETIC)
    assert resolve_model(SYNTHETIC, synthetic_enabled=True).synthetic


def test_available_models_lists_the_default_first_and_synthetic_only_when_enabled():
    assert available_models("smollm2-135m-instruct")[0] == "smollm2-135m-instruct"
    assert SYNTHETIC not in available_models("smollm2-135m-instruct")
    assert SYNTHETIC in available_models("smollm2-135m-instruct", synthetic_enabled=True)


def test_concurrent_first_loads_convert_once(source, tmp_path):
    convert = CountingConvert()
    results: list = []

    def first_load() -> None:
        results.append(cached_conversion(source, tmp_path / "cache", convert, load_cpu))

    threads = [threading.Thread(target=first_load) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert convert.calls == 1
    assert len(results) == 3
    assert all(model.config.hidden_size == 16 for model, _ in results)


def test_a_model_built_while_another_thread_builds_one_keeps_its_tied_weights(tmp_path, monkeypatch):
    # transformers swaps PreTrainedModel.tie_weights for a no-op, process-wide, while it builds
    # a model; a second thread building one meanwhile used to come out with an lm_head left
    # on the meta device. Thread "first" is held inside its build while "second" loads.
    import transformers.modeling_utils as modeling_utils

    source = tmp_path / "tied.json"
    source.write_text(json.dumps({"vocab": 32, "tied": True}))
    model_dir = tmp_path / "tied"
    build_tiny_model(source, model_dir)

    inside, release = threading.Event(), threading.Event()
    original = modeling_utils.patch_output_recorders

    def held_in_the_first_build(model):
        if threading.current_thread().name == "first":
            inside.set()
            release.wait(30)
        return original(model)

    monkeypatch.setattr(modeling_utils, "patch_output_recorders", held_in_the_first_build)
    models: dict[str, Any] = {}

    def load(name: str) -> None:
        models[name] = load_cpu(model_dir)[0]

    first = threading.Thread(target=load, args=("first",), name="first")
    second = threading.Thread(target=load, args=("second",), name="second")
    first.start()
    assert inside.wait(30)
    second.start()
    second.join(2)  # long enough for a tiny model to load, were it let through
    release.set()
    first.join(30)
    second.join(30)

    for model in models.values():
        assert model.lm_head.weight.device.type == "cpu"
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert set(models) == {"first", "second"}
