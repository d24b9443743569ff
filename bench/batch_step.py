"""What one decoding step costs as the batch grows: the reason batching pays.

    python -m bench.batch_step [--sizes 1,2,4,8,16,32] [--steps 20] [--device cpu] [--dtype auto]
                               [--quantization none] [--path dynamic|static|compiled] [--sdpa]

For each batch size it prefills that many different chat prompts together, then times
`--steps` decoding steps of the batch the batched scheduler runs (`--path`: the dynamic
`TransformersBatch`, the default; `static`, GENERATION_CUDA_GRAPHS=1's slots; `compiled`,
those slots with GENERATION_COMPILE=1's compiled step, whose compile time is reported) and
reports milliseconds per step, the step's cost relative to one row, and tokens/s. `--sdpa`
keeps torch's SDPA for a bfloat16 model's decoding steps (inference.attention), to compare.
Writes bench/results/batch_step-<dtype>[-<quantization>][-<path>][-sdpa].json, or `--results`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

RESULTS_DIR = Path(__file__).parent / "results"
TOPICS = ["dragons", "the sea", "volcanoes", "bicycles", "coffee", "robots", "winter", "trains"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,2,4,8,16,32")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto", help="CHAT_DTYPE: auto, float32, bfloat16")
    parser.add_argument("--quantization", default="none", help="CHAT_QUANTIZATION: none, int8, int4")
    parser.add_argument("--path", choices=("dynamic", "static", "compiled"), default="dynamic")
    parser.add_argument("--sdpa", action="store_true", help="SDPA for bfloat16 decoding steps too")
    parser.add_argument("--results", type=Path, help="where to write (default: named by the options)")
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    import django

    django.setup()
    from django.conf import settings

    from inference.batching import Sequence, open_batch
    from inference.generators import GenerationParams, load_generator
    from inference.registry import resolve_model

    generator = load_generator(
        resolve_model("smollm2-135m-instruct"),
        cache_dir=settings.MODEL_CACHE_DIR,
        device=args.device,
        dtype=args.dtype,
        synthetic_tokens_per_s=50,
        quantization=args.quantization,
    )
    if args.sdpa:
        generator.model.set_attn_implementation("sdpa")  # type: ignore[attr-defined]
    sizes = [int(size) for size in args.sizes.split(",")]
    static, started = args.path != "dynamic", time.perf_counter()
    # One static batch for every size: its slots are allocated (and its step compiled) once.
    compiled = args.path == "compiled"
    static_batch = static and open_batch(
        generator, max_rows=max(sizes), cuda_graphs="1", row_tokens=1024, compiled=compiled
    )
    compile_s = time.perf_counter() - started if compiled else None
    params = GenerationParams(max_tokens=args.steps + 2, temperature=0)
    rows = []
    for size in sizes:
        batch = static_batch if static else open_batch(generator)
        for n in range(size):
            prompt = [{"role": "user", "content": f"Tell me a long story about {TOPICS[n % len(TOPICS)]} ({n})."}]
            batch.add(Sequence(prompt, params, lambda text: None, lambda: False))
        started = time.perf_counter()
        batch.step()  # the prefill, and every row's first token
        prefill_s = time.perf_counter() - started
        started = time.perf_counter()
        for _ in range(args.steps):
            batch.step()
        step_s = (time.perf_counter() - started) / args.steps
        rows.append({"rows": size, "prefill_s": prefill_s, "step_ms": step_s * 1000, "tokens_per_s": size / step_s})
        batch.cancel_all()
    one = rows[0]["step_ms"]
    print(f"{'rows':>5} {'prefill s':>10} {'step ms':>8} {'vs 1 row':>10} {'tokens/s':>9}")
    for row in rows:
        row["relative_step"] = row["step_ms"] / one
        print(
            f"{row['rows']:>5} {row['prefill_s']:>10.3f} {row['step_ms']:>8.1f}"
            f" {row['relative_step']:>10.2f} {row['tokens_per_s']:>9.1f}"
        )
    dtype = str(generator.model.dtype).split(".")[-1]  # type: ignore[attr-defined]
    attention = generator.model.config._attn_implementation  # type: ignore[attr-defined]
    print(f"dtype: {dtype}, quantization: {args.quantization}, path: {args.path}, attention: {attention}")
    if compile_s is not None:
        print(f"compiled in {compile_s:.1f} s")
    summary = {
        **{"device": args.device, "dtype": dtype, "quantization": args.quantization, "path": args.path},
        "attention": attention,
        **{"compile_s": compile_s, "steps": args.steps, "rows": rows},
    }
    suffixes = [*[args.quantization] * (args.quantization != "none"), *[args.path] * static, *["sdpa"] * args.sdpa]
    name = "-".join([f"batch_step-{dtype}", *suffixes])
    (args.results or RESULTS_DIR / f"{name}.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
