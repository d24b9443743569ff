"""Where a benchmark's results go: its summary, which is committed, and its raw samples.

bench/results/NAME.json holds the figures docs/benchmarks.md cites; the per-request records
or samples they were computed from go to bench/results/raw/NAME.json, which git ignores.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def raw_path(path: Path) -> Path:
    """The raw samples' file of a results file: raw/NAME.json beside it."""
    return path.parent / "raw" / path.name


def write(path: Path, summary: dict[str, Any], raw: dict[str, Any] | None = None) -> None:
    """The summary to `path`, readable; the raw samples, if any, compact beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2) + "\n")
    if raw is not None:
        raw_file = raw_path(path)
        raw_file.parent.mkdir(parents=True, exist_ok=True)
        raw_file.write_text(json.dumps(raw) + "\n")
