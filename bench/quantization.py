"""How far CHAT_QUANTIZATION=int8 or int4 strays from the unquantized model's answers.

    python -m bench.quantization [--quantization int8] [--dtype float32] [--tokens 64]
                                 [--results bench/results/quantization.json]

Loads the packaged model twice, as the server does (unquantized in `--dtype`, and with
torchao's weight-only int8 in the same dtype, or int4 in bfloat16, the only dtype it
computes in), and answers bench.concurrency's 16 prompts greedily with each:

- teacher-forced agreement: along the unquantized model's answers, the share of positions
  where the quantized model's most likely next token is the same (one forward pass per answer,
  so one early difference does not count against every later token);
- free-running: how many of the quantized model's own answers equal the unquantized ones, and
  how many tokens they share from the start, on average;
- the bytes of the weights each model holds.

Speed is bench.concurrency's and bench.batch_step's (CHAT_QUANTIZATION in the environment,
`--quantization`); this says what the speed costs in answers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import django

from bench.concurrency import MODEL, PROMPTS, RESULTS_DIR

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
django.setup()

import torch  # noqa: E402  (after Django: the model registry reads settings)
from django.conf import settings  # noqa: E402

from inference.generators import TransformersGenerator, load_generator  # noqa: E402
from inference.int4 import dense_copy_bytes, int4_only  # noqa: E402
from inference.registry import resolve_model  # noqa: E402


def load(quantization: str, dtype: str) -> TransformersGenerator:
    generator = load_generator(
        resolve_model(MODEL),
        cache_dir=settings.MODEL_CACHE_DIR,
        device="cpu",
        dtype=dtype,
        synthetic_tokens_per_s=0,
        quantization=quantization,
    )
    assert isinstance(generator, TransformersGenerator)
    return generator


def greedy_answer(generator: TransformersGenerator, prompt: str, tokens: int) -> tuple[list[int], list[int]]:
    """The prompt's ids and the greedy answer's, exactly `tokens` long."""
    ids = generator.encode([{"role": "user", "content": prompt}])
    with torch.inference_mode():
        out = generator.model.generate(**ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    prompt_ids = ids["input_ids"][0].tolist()
    return prompt_ids, out[0, len(prompt_ids) :].tolist()


def teacher_forced_agreement(model: Any, prompt_ids: list[int], answer: list[int]) -> int:
    """How many of `answer`'s tokens are `model`'s most likely next token, given every token
    before it (the prompt and the answer so far). int4's layers multiply in int4 throughout,
    as when decoding: a pass of this many rows would use their dense copies."""
    sequence = torch.tensor([prompt_ids + answer])
    with torch.inference_mode(), int4_only(model):
        logits = model(sequence).logits[0, len(prompt_ids) - 1 : -1]
    return int((logits.argmax(-1) == torch.tensor(answer)).sum())


def common_start(first: list[int], second: list[int]) -> int:
    """How many tokens the two answers share from their start."""
    pairs = enumerate(zip(first, second, strict=False))
    return next((n for n, (a, b) in pairs if a != b), min(len(first), len(second)))


def weight_bytes(model: Any) -> int:
    """Bytes of the weights, a quantized tensor's data and scales counted as stored, and
    int4's dense copies (inference.int4) that are not a weight's own tensor."""
    total = 0
    for parameter in model.parameters():
        inner = [getattr(parameter, name) for name in getattr(parameter, "tensor_data_names", ())] or [parameter]
        total += sum(tensor.numel() * tensor.element_size() for tensor in inner)
    return total + dense_copy_bytes(model)


def measure(quantization: str, dtype: str, tokens: int) -> dict[str, Any]:
    quantized_dtype = "auto" if quantization == "int4" else dtype  # int4's auto is bfloat16
    reference, quantized = load("none", dtype), load(quantization, quantized_dtype)
    agreed = equal = 0
    shared: list[int] = []
    started = time.monotonic()
    for prompt in PROMPTS:
        prompt_ids, answer = greedy_answer(reference, prompt, tokens)
        agreed += teacher_forced_agreement(quantized.model, prompt_ids, answer)
        _, own = greedy_answer(quantized, prompt, tokens)
        equal += own == answer
        shared.append(common_start(own, answer))
    return {
        "model": MODEL,
        "dtype": dtype,
        "quantization": quantization,
        "quantized_dtype": str(quantized.model.dtype).removeprefix("torch."),
        "tokens": tokens,
        "prompts": len(PROMPTS),
        "teacher_forced_agreement": round(agreed / (tokens * len(PROMPTS)), 4),
        "answers_equal": equal,
        "mean_common_start_tokens": round(statistics.mean(shared), 1),
        "weight_bytes": {"none": weight_bytes(reference.model), quantization: weight_bytes(quantized.model)},
        "seconds": round(time.monotonic() - started, 1),
        "torch_threads": torch.get_num_threads(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quantization", choices=("int8", "int4"), default="int8")
    parser.add_argument("--dtype", default="float32", help="CHAT_DTYPE of the unquantized model (and of int8's)")
    parser.add_argument("--tokens", type=int, default=64, help="answer length")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR / "quantization.json")
    args = parser.parse_args()
    result = measure(args.quantization, args.dtype, args.tokens)
    args.results.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
