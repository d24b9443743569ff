"""What one decoding step costs as the batch grows: the reason batching pays.

    python -m bench.batch_step [--sizes 1,2,4,8,16,32] [--steps 20] [--device cpu] [--dtype auto]

For each batch size it prefills that many different chat prompts together, then times
`--steps` decoding steps of `inference.batching.TransformersBatch` (the code the batched
scheduler runs) and reports milliseconds per step, the step's cost relative to one row,
and tokens/s. Writes bench/results/batch_step-<dtype>.json.
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
    )
    params = GenerationParams(max_tokens=args.steps + 2, temperature=0)
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        batch = open_batch(generator)
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
    one = rows[0]["step_ms"]
    print(f"{'rows':>5} {'prefill s':>10} {'step ms':>8} {'vs 1 row':>10} {'tokens/s':>9}")
    for row in rows:
        row["relative_step"] = row["step_ms"] / one
        print(
            f"{row['rows']:>5} {row['prefill_s']:>10.3f} {row['step_ms']:>8.1f}"
            f" {row['relative_step']:>10.2f} {row['tokens_per_s']:>9.1f}"
        )
    print(f"dtype: {generator.model.dtype}")  # type: ignore[attr-defined]
    summary = {"device": args.device, "dtype": str(generator.model.dtype), "steps": args.steps, "rows": rows}  # type: ignore[attr-defined]
    dtype = str(generator.model.dtype).split(".")[-1]  # type: ignore[attr-defined]
    (RESULTS_DIR / f"batch_step-{dtype}.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
