"""The table and the goals of a bench/gpu.sh run, from its results files.

    python -m bench.gpu_summary DIR

Reads DIR/concurrency-gpu-{graphs,eager,peer}.json (those present) and prints each
system's tokens/s, first-token p50 and errors per level, then the GPU goals of
docs/benchmarks.md, each met, missed, or not measured.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SYSTEMS = {
    "gpu-graphs": "chatsite, GENERATION_CUDA_GRAPHS=1",
    "gpu-eager": "chatsite, GENERATION_CUDA_GRAPHS=0",
    "gpu-peer": "transformers serve --continuous-batching",
}


def load_runs(directory: Path) -> dict[str, dict[int, dict[str, Any]]]:
    """Each system's levels, by concurrency."""
    runs = {}
    for label in SYSTEMS:
        path = directory / f"concurrency-{label}.json"
        if path.exists():
            runs[label] = {level["concurrency"]: level for level in json.loads(path.read_text())["levels"]}
    return runs


def table(runs: dict[str, dict[int, dict[str, Any]]]) -> list[str]:
    lines = [f"{'system':<42}{'level':>6}{'tok/s':>10}{'TTFT p50':>10}{'errors':>8}"]
    for label, levels in runs.items():
        for concurrency, level in sorted(levels.items()):
            ttft = level["ttft_median_s"]
            lines.append(
                f"{SYSTEMS[label]:<42}{concurrency:>6}{level['agg_tokens_per_s']:>10.1f}"
                f"{'-' if ttft is None else f'{ttft:.3f}':>10}{level['errors']:>8}"
            )
    return lines


def goals(runs: dict[str, dict[int, dict[str, Any]]]) -> list[str]:
    """The goals on an H200 (issue #18), checked on chatsite with CUDA graphs."""
    ours, peer = runs.get("gpu-graphs", {}), runs.get("gpu-peer", {})

    def verdict(name: str, value: bool | None, detail: str) -> str:
        state = "not measured" if value is None else "met" if value else "MISSED"
        return f"{state:>12}  {name}: {detail}"

    lines = []
    for concurrency in (256, 512):
        level = ours.get(concurrency)
        errors = None if level is None else level["errors"]
        lines.append(
            verdict(f"no errors at {concurrency} streams", None if level is None else errors == 0, f"{errors}")
        )
    one = ours.get(1)
    lines.append(
        verdict(
            "c=1 >= 150 tok/s",
            None if one is None else one["agg_tokens_per_s"] >= 150,
            "-" if one is None else f"{one['agg_tokens_per_s']:.1f}",
        )
    )
    mine, theirs = ours.get(256), peer.get(256)
    ratio = (
        mine["agg_tokens_per_s"] / theirs["agg_tokens_per_s"]
        if mine and theirs and theirs["agg_tokens_per_s"]
        else None
    )
    lines.append(
        verdict(
            "c=256 >= 3x transformers serve",
            None if ratio is None else ratio >= 3,
            "-" if ratio is None else f"{ratio:.2f}x",
        )
    )
    ttft = mine["ttft_median_s"] if mine else None
    lines.append(
        verdict(
            "TTFT p50 at 256 <= 1 s", None if ttft is None else ttft <= 1.0, "-" if ttft is None else f"{ttft:.3f} s"
        )
    )
    return lines


def main() -> None:
    runs = load_runs(Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results"))
    print("\n".join([*table(runs), "", "Goals (H200):", *goals(runs)]))


if __name__ == "__main__":
    main()
