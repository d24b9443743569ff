"""GENERATION_BACKEND=celery against in-process generation: the same API load, same run.

    .venv/bin/python -m bench.backends [--concurrency 8] [--max-tokens 128] [--requests N]
        [--dtype auto] [--device auto] [--max-concurrent N] [--client openai|httpx]
        [--inprocess-redis] [--results bench/results/backends.json] [--logs DIR]

Two phases, one after the other, each with bench.concurrency's closed loop at one level
(`--concurrency` streaming chat completions through the official openai client, greedy,
`--max-tokens`; --requests of them, default max(2N, 8)) after its warm-up (one request
alone, then a burst of N), against SmolLM2-135M-Instruct with the app's defaults:

1. in-process: one daphne web process that runs the model itself. Its stream store is
   in memory, as with no REDIS_URL (`--inprocess-redis`: on Redis, like the celery phase).
2. celery: one daphne web process, which holds no model, and one Celery generation worker
   (`celery -A chatsite worker -Q generation -P threads`) with the same model and settings.
   Requests cross the `generation` queue; tokens come back through Redis streams.

Each phase has a database of its own (PostgreSQL beside DATABASE_URL when it names one,
else SQLite). Redis: REDIS_URL, default redis://127.0.0.1:6379/0; the celery phase's keys
are under a prefix of their own, deleted afterwards.

`--rounds` pairs of phases (default 3) run alternately, and the targets are judged on
the medians over the rounds of the ratio and of the TTFT difference.

Per phase: aggregate tokens/s, TTFT median and p95, the gaps between chunks, the web's
(and the worker's) RSS and tracebacks in their logs. Targets: celery tokens/s ≥ 0.9 x
in-process; TTFT median celery - in-process ≤ +30 ms; no failed request. Writes
bench/results/backends.json; exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.concurrency import (
    MODEL,
    PROMPTS,
    RESULTS_DIR,
    Target,
    bench_api_key,
    measure,
    prepare_model,
    process_memory_mb,
    requests_for,
    resolved_dtype,
    site_env,
)
from bench.livesite import LiveSite, LiveWorker, keep_logs, log_errors, scratch_database, scratch_redis_prefix

RESULTS = RESULTS_DIR / "backends.json"
THROUGHPUT_TARGET = 0.9  # celery tokens/s ÷ in-process tokens/s, at least
TTFT_TARGET_MS = 30.0  # celery TTFT median - in-process TTFT median, at most


def load_args(args: argparse.Namespace) -> argparse.Namespace:
    """The flags bench.concurrency's site_env() and measure() read, for one level."""
    return argparse.Namespace(
        levels=[args.concurrency],
        requests=args.requests,
        max_tokens=args.max_tokens,
        client=args.client,
        warmup_burst=True,
        model=MODEL,
        scheduler="batched",
        max_concurrent=args.max_concurrent,
        device=args.device,
        dtype=args.dtype,
    )


def run_inprocess(load: argparse.Namespace, args: argparse.Namespace, redis_url: str) -> dict[str, Any]:
    with scratch_database() as database_url, scratch_redis_prefix(redis_url, "chatsite-backends") as prefix:
        env = {**site_env(load), "DATABASE_URL": database_url, "GENERATION_BACKEND": "inprocess"}
        # An empty REDIS_URL is the app's default: streams in the web process's memory.
        env.update({"REDIS_URL": redis_url, "REDIS_KEY_PREFIX": prefix} if args.inprocess_redis else {"REDIS_URL": ""})
        with LiveSite(env=env) as site:
            assert site.process is not None
            pid = site.process.pid
            started_rss = process_memory_mb(pid)
            measured = measure(Target(site.base_url, bench_api_key(site), MODEL), load, server_pid=pid)
            web = {
                "ready_after_s": site.ready_after_s,
                "rss_mb": {"started": started_rss, "warm": measured["warmup"]["server_rss_mb"]},
            }
            web["rss_mb"]["end"] = process_memory_mb(pid)
            web["log"] = log_errors(site.log())
            keep_logs(args.logs, {"inprocess-web": site.log_path})
    return {
        "backend": "inprocess",
        "stream_store": "redis" if args.inprocess_redis else "memory",
        "web": web,
        **measured,
    }


def run_celery(load: argparse.Namespace, args: argparse.Namespace, redis_url: str) -> dict[str, Any]:
    with scratch_database() as database_url, scratch_redis_prefix(redis_url, "chatsite-backends") as prefix:
        env = {
            **site_env(load),
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "REDIS_KEY_PREFIX": prefix,
            "GENERATION_BACKEND": "celery",
        }
        with LiveSite(env=env) as site:
            assert site.process is not None
            web_pid = site.process.pid
            web = {"ready_after_s": site.ready_after_s, "rss_mb": {"started": process_memory_mb(web_pid)}}
            worker_started = time.monotonic()
            with LiveWorker(site.env) as worker:
                assert worker.process is not None
                worker_pid = worker.process.pid
                worker_rss = {"started": process_memory_mb(worker_pid)}
                worker_ready_s = time.monotonic() - worker_started
                measured = measure(Target(site.base_url, bench_api_key(site), MODEL), load, server_pid=web_pid)
                web["rss_mb"].update(warm=measured["warmup"]["server_rss_mb"], end=process_memory_mb(web_pid))
                worker_rss["end"] = process_memory_mb(worker_pid)
                worker_log = log_errors(worker.log())
                keep_logs(args.logs, {"celery-web": site.log_path, "celery-worker": worker.log_path})
            web["log"] = log_errors(site.log())
    worker_figures = {"ready_after_s": worker_ready_s, "rss_mb": worker_rss, "log": worker_log}
    return {"backend": "celery", "stream_store": "redis", "web": web, "worker": worker_figures, **measured}


def comparison(inprocess: dict[str, Any], celery: dict[str, Any]) -> dict[str, Any]:
    local, remote = inprocess["levels"][0], celery["levels"][0]
    ratio = remote["agg_tokens_per_s"] / local["agg_tokens_per_s"] if local["agg_tokens_per_s"] else None
    ttft_ms = None
    if local["ttft_median_s"] is not None and remote["ttft_median_s"] is not None:
        ttft_ms = (remote["ttft_median_s"] - local["ttft_median_s"]) * 1000
    errors = local["errors"] + remote["errors"]
    return {"tokens_per_s_ratio": ratio, "ttft_median_diff_ms": ttft_ms, "errors": errors}


def over_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds' medians of the ratio and the TTFT difference, and the targets on them.

    On a small machine one phase's figures move by 10-20 % from run to run; alternating
    the two backends and taking medians keeps that noise out of the comparison."""
    ratios = [r["tokens_per_s_ratio"] for r in rounds if r["tokens_per_s_ratio"] is not None]
    diffs = [r["ttft_median_diff_ms"] for r in rounds if r["ttft_median_diff_ms"] is not None]
    ratio = statistics.median(ratios) if ratios else None
    ttft_ms = statistics.median(diffs) if diffs else None
    targets = {
        f"celery tokens/s >= {THROUGHPUT_TARGET} x in-process": ratio is not None and ratio >= THROUGHPUT_TARGET,
        f"TTFT median celery - in-process <= +{TTFT_TARGET_MS:.0f} ms": ttft_ms is not None
        and ttft_ms <= TTFT_TARGET_MS,
        "no failed request in either phase": all(r["errors"] == 0 for r in rounds),
    }
    return {"tokens_per_s_ratio": ratio, "ttft_median_diff_ms": ttft_ms, "targets": targets}


def print_table(inprocess: dict[str, Any], celery: dict[str, Any], compared: dict[str, Any]) -> None:
    def ms(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1000:.0f}"

    def mb(figures: dict[str, Any] | None, key: str = "rss") -> str:
        return "-" if not figures else f"{figures[key]:.0f}"

    print()
    print(f"{'backend':<12}{'requests':>9}{'errors':>7}{'agg tok/s':>10}{'TTFT med ms':>12}{'TTFT p95 ms':>12}"
          f"{'gap med ms':>11}{'web RSS MB':>11}{'worker RSS MB':>14}")  # fmt: skip
    for phase in (inprocess, celery):
        level = phase["levels"][0]
        worker = phase.get("worker")
        print(
            f"{phase['backend']:<12}{level['requests']:>9}{level['errors']:>7}{level['agg_tokens_per_s']:>10.1f}"
            f"{ms(level['ttft_median_s']):>12}{ms(level['ttft_p95_s']):>12}{ms(level['gap_median_s']):>11}"
            f"{mb(phase['web']['rss_mb']['end']):>11}{mb(worker['rss_mb']['end'] if worker else None):>14}"
        )
    ratio, diff = compared["tokens_per_s_ratio"], compared["ttft_median_diff_ms"]
    print(f"celery tok/s ÷ in-process tok/s: {'-' if ratio is None else f'{ratio:.3f}'}")
    print(f"TTFT median celery - in-process: {'-' if diff is None else f'{diff:+.1f} ms'}")
    for phase in (inprocess, celery):
        for process in ("web", "worker"):
            for error, count in phase.get(process, {}).get("log", {}).get("errors", {}).items():
                print(f"{phase['backend']} {process} log: {count} x {error}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=8, help="streams at once (one closed-loop level)")
    parser.add_argument("--requests", type=int, help="requests per phase (default max(2N, 8))")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--client", choices=("openai", "httpx"), default="openai")
    parser.add_argument("--max-concurrent", type=int, help="GENERATION_MAX_CONCURRENT (default: the app's)")
    parser.add_argument("--device", help="CHAT_DEVICE (default: the app's, auto)")
    parser.add_argument("--dtype", help="CHAT_DTYPE (default: the app's, auto)")
    parser.add_argument("--inprocess-redis", action="store_true", help="in-process phase with its streams on Redis too")
    parser.add_argument("--rounds", type=int, default=3, help="in-process/celery pairs, alternated")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the JSON goes")
    parser.add_argument("--logs", type=Path, help="copy the web and worker logs into this folder")
    args = parser.parse_args()
    if args.concurrency < 1:
        parser.error("--concurrency is at least 1")
    redis_url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    load = load_args(args)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")

    prepare_model(site_env(load))
    rounds = []
    for number in range(1, args.rounds + 1):
        print(f"== round {number}/{args.rounds}, in-process: {args.concurrency} streams, max_tokens {args.max_tokens}")
        inprocess = run_inprocess(load, args, redis_url)
        print(f"== round {number}/{args.rounds}, celery: web + generation worker", flush=True)
        celery = run_celery(load, args, redis_url)
        rounds.append({"inprocess": inprocess, "celery": celery, **comparison(inprocess, celery)})
        print_table(inprocess, celery, rounds[-1])
    compared = over_rounds(rounds)

    result = {
        "command": shlex.join(["python", "-m", "bench.backends", *sys.argv[1:]]),
        "date": started,
        "cpu_count": os.cpu_count(),
        "loadavg_end": os.getloadavg(),
        "settings": {
            "concurrency": args.concurrency,
            "requests": requests_for(args.concurrency, args.requests),
            "max_tokens": args.max_tokens,
            "client": args.client,
            "warmup_burst": True,
            "prompts": len(PROMPTS),
            "temperature": 0,
            "model": MODEL,
            "max_concurrent": args.max_concurrent,
            "device": args.device or os.environ.get("CHAT_DEVICE", "auto"),
            "dtype": resolved_dtype(load),
            "redis_url": redis_url,
        },
        "rounds": rounds,
        **compared,
        "all_targets_met": all(compared["targets"].values()),
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nover {args.rounds} rounds (medians):")
    print(
        f"celery tok/s ÷ in-process tok/s: {compared['tokens_per_s_ratio']:.3f}  (rounds: "
        + ", ".join(f"{r['tokens_per_s_ratio']:.3f}" for r in rounds)
        + ")"
    )
    print(
        f"TTFT median celery - in-process: {compared['ttft_median_diff_ms']:+.1f} ms  (rounds: "
        + ", ".join(f"{r['ttft_median_diff_ms']:+.1f}" for r in rounds)
        + ")"
    )
    for name, met in compared["targets"].items():
        print(f"target {name}: {'met' if met else 'MISSED'}")
    print(f"results written to {args.results}")
    sys.exit(0 if result["all_targets_met"] else 1)


if __name__ == "__main__":
    main()
