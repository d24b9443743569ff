"""The headline benchmarks on two git revisions, in one run: did a change cost anything?

    python -m bench.revisions BEFORE [AFTER] [--rounds 2]

Checks each revision out into a temporary worktree (AFTER defaults to the working tree)
and runs, in alternating order so that the machine's drift hits both alike:
`bench.streaming --runs 3` (tokens/s over HTTP/SSE ÷ raw generate) and
`bench.concurrency --levels 8` (aggregate tokens/s and TTFT of 8 concurrent API
streams). Both revisions use this virtual environment and the same converted model.
Writes bench/results/revisions.json; docs/benchmarks.md explains it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "revisions.json"
MODEL_CACHE = ROOT / ".cache" / "models"


def checkout(revision: str, into: Path) -> Path:
    subprocess.run(["git", "worktree", "add", "--detach", str(into), revision], cwd=ROOT, check=True)
    return into


def run_bench(tree: Path, results: Path, *arguments: str) -> None:
    env = {**os.environ, "MODEL_CACHE_DIR": str(MODEL_CACHE), "BENCH_RESULTS_DIR": str(results)}
    subprocess.run([sys.executable, "-m", *arguments], cwd=tree, env=env, check=True)


def measure(tree: Path) -> dict[str, float]:
    results = Path(tempfile.mkdtemp(prefix="chatsite-revision-"))
    run_bench(tree, results, "bench.streaming", "--runs", "3")
    # A revision older than bench.revisions writes it into its own tree.
    written = [results / "streaming.json", tree / "bench" / "results" / "streaming.json"]
    streaming = json.loads(next(path for path in written if path.exists()).read_text())
    run_bench(tree, results, "bench.concurrency", "--levels", "8", "--requests", "16", "--label", "revision")
    [level] = json.loads((results / "concurrency-revision.json").read_text())["levels"]
    return {
        "streaming_ratio": streaming["throughput_ratio"],
        "streaming_ttft_overhead_ms": streaming["ttft_overhead_ms"],
        "c8_tokens_per_s": level["agg_tokens_per_s"],
        "c8_ttft_median_s": level["ttft_median_s"],
        "c8_errors": level["errors"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before")
    parser.add_argument("after", nargs="?", help="a revision (default: the working tree)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="chatsite-revisions-") as scratch:
        trees = {"before": checkout(args.before, Path(scratch) / "before")}
        trees["after"] = checkout(args.after, Path(scratch) / "after") if args.after else ROOT
        try:
            rounds: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
            for round_number in range(args.rounds):
                order = ["before", "after"] if round_number % 2 == 0 else ["after", "before"]
                for name in order:
                    rounds[name].append(measure(trees[name]))
        finally:
            for tree in trees.values():
                if tree != ROOT:
                    subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)

    medians: dict[str, Any] = {
        name: {figure: statistics.median(run[figure] for run in runs) for figure in runs[0]}
        for name, runs in rounds.items()
    }
    payload = {
        "command": "python -m bench.revisions " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "cpu_count": os.cpu_count(),
        "revisions": {"before": args.before, "after": args.after or "working tree"},
        "medians": medians,
        "rounds": rounds,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(payload, indent=2) + "\n")
    for figure in medians["before"]:
        print(f"{figure:<32}{medians['before'][figure]:>12.3f}{medians['after'][figure]:>12.3f}")


if __name__ == "__main__":
    main()
