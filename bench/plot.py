"""Plot the concurrency results: aggregate tokens/s and median TTFT against streams.

    python -m bench.plot [RESULTS.json ...] [--output docs/concurrency.png]

Without files, takes the runs `make bench-concurrency` makes (CONCURRENCY_RUNS: each
chatsite scheduler, and the peer), one line per file. Two panels, log-scaled
concurrency axis. Needs matplotlib (bench/requirements.txt).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.concurrency import RESULTS_DIR
from tests.support.livesite import ROOT

OUTPUT = ROOT / "docs" / "concurrency.png"


# docs/concurrency.png's lines (docs/benchmarks.md: Concurrency); other runs are plotted by name.
CONCURRENCY_RUNS = ("batched", "batched-float32", "peer", "peer-bfloat16", "sequential")


def load_results(paths: list[Path]) -> list[dict[str, Any]]:
    paths = paths or [RESULTS_DIR / f"concurrency-{label}.json" for label in CONCURRENCY_RUNS]
    return [json.loads(path.read_text()) for path in paths]


def series_name(result: dict[str, Any]) -> str:
    """Who served (and with which scheduler), in which dtype; or the run's own label."""
    settings = result["settings"]
    if result.get("label") not in (None, settings["scheduler"]):
        return str(result["label"])
    if result["server"] == "chatsite":
        return f"chatsite, {settings['scheduler']}, {settings.get('dtype', '?')}"
    return f"transformers serve --cb, {settings.get('dtype', '?')}"


def plot(results: list[dict[str, Any]], output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (throughput, ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    levels: set[int] = set()
    for result in results:
        rows = [level for level in result["levels"] if level["ttft_median_s"] is not None]
        x = [level["concurrency"] for level in rows]
        levels.update(x)
        style = {"marker": "o", "label": series_name(result)}
        throughput.plot(x, [level["agg_tokens_per_s"] for level in rows], **style)
        ttft.plot(x, [level["ttft_median_s"] for level in rows], **style)
    for axes, title, unit in (
        (throughput, "Aggregate throughput", "completion tokens/s, all streams"),
        (ttft, "Time to first token", "median TTFT (s)"),
    ):
        axes.set_xscale("log", base=2)
        axes.set_xticks(sorted(levels), [str(level) for level in sorted(levels)])
        axes.set_xlabel("concurrent streams")
        axes.set_ylabel(unit)
        axes.set_title(title)
        axes.grid(True, alpha=0.3)
    throughput.set_ylim(bottom=0)
    # TTFT spans 0.07 s to tens of seconds (the sequential queue): a log scale shows both.
    ttft.set_yscale("log")
    throughput.legend(fontsize="small")
    first = results[0]
    device = str(first["settings"].get("device", ""))
    machine = device if device.startswith("cuda") else f"{first['cpu_count']} CPU cores"
    figure.suptitle(
        f"{first['settings']['model']}, {first['settings']['max_tokens']} new tokens, greedy, "
        f"{machine} ({first['date'][:10]})"
    )
    figure.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="*", type=Path)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    # chatsite's runs first, then the peer, in a stable order.
    results = sorted(load_results(args.results), key=lambda r: (r["server"] != "chatsite", r["label"]))
    if not results:
        parser.error(f"no concurrency results in {RESULTS_DIR}")
    plot(results, args.output)
    print(f"plot written to {args.output}")


if __name__ == "__main__":
    main()
