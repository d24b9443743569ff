"""GENERATION_BACKEND=celery against in-process generation: the same API load, same run.

    .venv/bin/python -m bench.backends [--concurrency 8] [--max-tokens 128] [--requests N]
        [--rounds 6] [--dtype auto] [--device auto] [--max-concurrent N]
        [--client openai|httpx] [--inprocess-redis] [--results bench/results/backends.json]
        [--logs DIR]

Two deployments run side by side, against SmolLM2-135M-Instruct with the app's defaults:

1. in-process: one daphne web process that runs the model itself. Its stream store is
   in memory, as with no REDIS_URL (`--inprocess-redis`: on Redis, like the celery one).
2. celery: one daphne web process, which holds no model, and one Celery generation worker
   (`celery -A chatsite worker -Q generation -P threads`) with the same model and settings.
   Requests cross the `generation` queue; tokens come back through Redis streams.

Each has a database of its own (PostgreSQL beside DATABASE_URL when it names one, else
SQLite) and Redis keys under a prefix of its own, deleted afterwards (REDIS_URL, default
redis://127.0.0.1:6379/0). Both are warmed up (bench.concurrency's first request alone,
then a burst of N), then `--rounds` rounds each run bench.concurrency's closed loop at one
level against one deployment and then the other (`--concurrency` streaming chat
completions through the official openai client, greedy, `--max-tokens`; --requests of
them, default max(2N, 8)), the order swapped every round, each level right after a short
burst on the same deployment that is not measured (see rewarm()). The idle deployment
costs nothing, so the two measurements of a round see the same machine: on a shared
2-core machine one phase's figures move by 10-30 % from minute to minute, far more than
the difference being measured. The targets are judged on the medians over the rounds of
the ratio and of the TTFT difference.

Per round: aggregate tokens/s, TTFT median and p95 and the gaps between chunks of each
backend; at the end the web's (and the worker's) RSS and the tracebacks in their logs.
Targets: celery tokens/s >= 0.9 x in-process; TTFT median celery - in-process <= +30 ms;
no failed request. Writes bench/results/backends.json; exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from bench.concurrency import (
    MODEL,
    PROMPTS,
    RESULTS_DIR,
    Target,
    bench_api_key,
    prepare_model,
    process_memory_mb,
    requests_for,
    resolved_dtype,
    run_level,
    site_env,
    warm_up,
    without_records,
)
from tests.support.livesite import LiveSite, LiveWorker, keep_logs, log_errors, scratch_database, scratch_redis_prefix

RESULTS = RESULTS_DIR / "backends.json"
THROUGHPUT_TARGET = 0.9  # celery tokens/s ÷ in-process tokens/s, at least
TTFT_TARGET_MS = 30.0  # celery TTFT median - in-process TTFT median, at most
BACKENDS = ("inprocess", "celery")
REWARM_TOKENS = 16


def load_args(args: argparse.Namespace) -> argparse.Namespace:
    """The flags bench.concurrency's site_env() reads."""
    return argparse.Namespace(
        model=MODEL,
        scheduler="batched",
        max_concurrent=args.max_concurrent,
        device=args.device,
        dtype=args.dtype,
    )


@dataclass
class Deployment:
    """One backend's processes, up for the whole run."""

    backend: str
    stream_store: str
    site: LiveSite
    worker: LiveWorker | None = None
    figures: dict[str, Any] = field(default_factory=dict)  # start-up times and memory

    @cached_property
    def target(self) -> Target:  # makes the benchmark's user and key, once
        return Target(self.site.base_url, bench_api_key(self.site), MODEL)

    @property
    def web_pid(self) -> int:
        assert self.site.process is not None
        return self.site.process.pid

    def processes(self) -> dict[str, tuple[int, Path]]:
        """name -> (pid, log path) of its processes."""
        found = {"web": (self.web_pid, self.site.log_path)}
        if self.worker is not None and self.worker.process is not None:
            found["worker"] = (self.worker.process.pid, self.worker.log_path)
        return found


@contextmanager
def inprocess_deployment(load: argparse.Namespace, args: argparse.Namespace, redis_url: str) -> Iterator[Deployment]:
    with scratch_database() as database_url, scratch_redis_prefix(redis_url, "chatsite-backends") as prefix:
        env = {**site_env(load), "DATABASE_URL": database_url, "GENERATION_BACKEND": "inprocess"}
        # An empty REDIS_URL is the app's default: streams in the web process's memory.
        env.update({"REDIS_URL": redis_url, "REDIS_KEY_PREFIX": prefix} if args.inprocess_redis else {"REDIS_URL": ""})
        with LiveSite(env=env) as site:
            store = "redis" if args.inprocess_redis else "memory"
            deployment = Deployment("inprocess", store, site, figures={"web_ready_after_s": site.ready_after_s})
            yield deployment


@contextmanager
def celery_deployment(load: argparse.Namespace, redis_url: str) -> Iterator[Deployment]:
    with scratch_database() as database_url, scratch_redis_prefix(redis_url, "chatsite-backends") as prefix:
        env = {
            **site_env(load),
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "REDIS_KEY_PREFIX": prefix,
            "GENERATION_BACKEND": "celery",
        }
        with LiveSite(env=env) as site:
            worker_started = time.monotonic()
            with LiveWorker(site.env) as worker:
                worker_ready_s = time.monotonic() - worker_started
                figures = {"web_ready_after_s": site.ready_after_s, "worker_ready_after_s": worker_ready_s}
                yield Deployment("celery", "redis", site, worker, figures)


async def rewarm(deployment: Deployment, args: argparse.Namespace) -> None:
    """A short burst, not measured, right before a measured level.

    A deployment that sat idle while the other one ran starts its next level slower
    (~100 ms more TTFT on its first prefill here): its memory had to come back. A
    real deployment does not take turns with another one on its machine."""
    await run_level(deployment.target, args.concurrency, args.concurrency, REWARM_TOKENS, client=args.client)


def memory(deployment: Deployment) -> dict[str, dict[str, float]]:
    return {name: process_memory_mb(pid) for name, (pid, _) in deployment.processes().items()}


def comparison(inprocess: dict[str, Any], celery: dict[str, Any]) -> dict[str, Any]:
    ratio = celery["agg_tokens_per_s"] / inprocess["agg_tokens_per_s"] if inprocess["agg_tokens_per_s"] else None
    ttft_ms = None
    if inprocess["ttft_median_s"] is not None and celery["ttft_median_s"] is not None:
        ttft_ms = (celery["ttft_median_s"] - inprocess["ttft_median_s"]) * 1000
    errors = inprocess["errors"] + celery["errors"]
    return {"tokens_per_s_ratio": ratio, "ttft_median_diff_ms": ttft_ms, "errors": errors}


def over_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds' medians of the ratio and the TTFT difference, and the targets on them."""
    ratios = [r["tokens_per_s_ratio"] for r in rounds if r["tokens_per_s_ratio"] is not None]
    diffs = [r["ttft_median_diff_ms"] for r in rounds if r["ttft_median_diff_ms"] is not None]
    ratio = statistics.median(ratios) if ratios else None
    ttft_ms = statistics.median(diffs) if diffs else None
    targets = {
        f"celery tokens/s >= {THROUGHPUT_TARGET} x in-process": ratio is not None and ratio >= THROUGHPUT_TARGET,
        f"TTFT median celery - in-process <= +{TTFT_TARGET_MS:.0f} ms": ttft_ms is not None
        and ttft_ms <= TTFT_TARGET_MS,
        "no failed request": all(r["errors"] == 0 for r in rounds),
    }
    return {"tokens_per_s_ratio": ratio, "ttft_median_diff_ms": ttft_ms, "targets": targets}


def print_round(number: int, measured: dict[str, dict[str, Any]], compared: dict[str, Any]) -> None:
    def ms(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1000:.0f}"

    print(f"{'round':<7}{'backend':<11}{'requests':>9}{'errors':>7}{'agg tok/s':>10}{'TTFT med ms':>12}"
          f"{'TTFT p95 ms':>12}{'gap med ms':>11}")  # fmt: skip
    for backend in BACKENDS:
        level = measured[backend]
        print(
            f"{number:<7}{backend:<11}{level['requests']:>9}{level['errors']:>7}{level['agg_tokens_per_s']:>10.1f}"
            f"{ms(level['ttft_median_s']):>12}{ms(level['ttft_p95_s']):>12}{ms(level['gap_median_s']):>11}"
        )
    ratio, diff = compared["tokens_per_s_ratio"], compared["ttft_median_diff_ms"]
    print(
        f"celery tok/s ÷ in-process tok/s: {'-' if ratio is None else f'{ratio:.3f}'}; "
        f"TTFT median celery - in-process: {'-' if diff is None else f'{diff:+.1f} ms'}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=8, help="streams at once (one closed-loop level)")
    parser.add_argument("--requests", type=int, help="requests per backend and round (default max(2N, 8))")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--client", choices=("openai", "httpx"), default="openai")
    parser.add_argument("--max-concurrent", type=int, help="GENERATION_MAX_CONCURRENT (default: the app's)")
    parser.add_argument("--device", help="CHAT_DEVICE (default: the app's, auto)")
    parser.add_argument("--dtype", help="CHAT_DTYPE (default: the app's, auto)")
    parser.add_argument("--inprocess-redis", action="store_true", help="in-process streams on Redis too")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of one level on each backend, alternated")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the JSON goes")
    parser.add_argument("--logs", type=Path, help="copy the web and worker logs into this folder")
    args = parser.parse_args()
    if args.concurrency < 1 or args.rounds < 1:
        parser.error("--concurrency and --rounds are at least 1")
    redis_url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    load = load_args(args)
    requests = requests_for(args.concurrency, args.requests)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")

    prepare_model(site_env(load))
    with ExitStack() as stack:
        print("== starting both deployments", flush=True)
        deployments = {
            "inprocess": stack.enter_context(inprocess_deployment(load, args, redis_url)),
            "celery": stack.enter_context(celery_deployment(load, redis_url)),
        }
        for deployment in deployments.values():
            deployment.figures["rss_mb_started"] = memory(deployment)
            warmed = asyncio.run(
                warm_up(
                    deployment.target,
                    args.concurrency,
                    args.max_tokens,
                    burst=True,
                    client=args.client,
                    server_pid=deployment.web_pid,
                )
            )
            deployment.figures["first_request_s"] = warmed["first_request"]["total_s"]
            print(f"== {deployment.backend} warmed up", flush=True)
        rounds = []
        for number in range(1, args.rounds + 1):
            # The order swaps every round, so neither backend always runs after the other.
            order = BACKENDS if number % 2 else BACKENDS[::-1]
            measured = {}
            for backend in order:
                deployment = deployments[backend]
                asyncio.run(rewarm(deployment, args))
                measured[backend] = asyncio.run(
                    run_level(
                        deployment.target,
                        args.concurrency,
                        requests,
                        args.max_tokens,
                        client=args.client,
                        server_pid=deployment.web_pid,
                    )
                )
            compared = comparison(measured["inprocess"], measured["celery"])
            print_round(number, measured, compared)
            rounds.append({"order": list(order), **{b: without_records(measured[b]) for b in BACKENDS}, **compared})
        for deployment in deployments.values():
            deployment.figures["rss_mb_end"] = memory(deployment)
            deployment.figures["logs"] = {
                name: log_errors(path.read_text(errors="replace")) for name, (_, path) in deployment.processes().items()
            }
            keep_logs(
                args.logs, {f"{deployment.backend}-{name}": path for name, (_, path) in deployment.processes().items()}
            )
    compared = over_rounds(rounds)

    result = {
        "command": shlex.join(["python", "-m", "bench.backends", *sys.argv[1:]]),
        "date": started,
        "cpu_count": os.cpu_count(),
        "loadavg_end": os.getloadavg(),
        "settings": {
            "concurrency": args.concurrency,
            "requests": requests,
            "rounds": args.rounds,
            "max_tokens": args.max_tokens,
            "client": args.client,
            "prompts": len(PROMPTS),
            "temperature": 0,
            "model": MODEL,
            "max_concurrent": args.max_concurrent,
            "device": args.device or os.environ.get("CHAT_DEVICE", "auto"),
            "dtype": resolved_dtype(load),
            "redis_url": redis_url,
        },
        "deployments": {name: {"stream_store": d.stream_store, **d.figures} for name, d in deployments.items()},
        "rounds": rounds,
        **compared,
        "all_targets_met": all(compared["targets"].values()),
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nover {args.rounds} rounds (medians):")
    for name, key, form in (
        ("celery tok/s ÷ in-process tok/s", "tokens_per_s_ratio", "{:.3f}"),
        ("TTFT median celery - in-process", "ttft_median_diff_ms", "{:+.1f} ms"),
    ):
        each = ", ".join("-" if r[key] is None else form.format(r[key]) for r in rounds)
        print(f"{name}: {'-' if compared[key] is None else form.format(compared[key])}  (rounds: {each})")
    for deployment in deployments.values():
        rss = ", ".join(f"{name} {figures['rss']:.0f} MB" for name, figures in deployment.figures["rss_mb_end"].items())
        print(f"{deployment.backend} RSS at the end: {rss}")
        for name, found in deployment.figures["logs"].items():
            for error, count in found.get("errors", {}).items():
                print(f"{deployment.backend} {name} log: {count} x {error}")
    for name, met in compared["targets"].items():
        print(f"target {name}: {'met' if met else 'MISSED'}")
    print(f"results written to {args.results}")
    sys.exit(0 if result["all_targets_met"] else 1)


if __name__ == "__main__":
    main()
