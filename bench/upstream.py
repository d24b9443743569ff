"""chatsite in front of a model server, against the same server called directly, same run.

    python -m bench.upstream [--server transformers|llama-server] [--levels 1,8] [--rounds 2]
        [--requests N] [--max-tokens 128] [--client openai|httpx] [--no-continuous-batching]
        [--server-cpus 1] [--results bench/results/upstream.json]

`--server llama-server` puts chatsite in front of llama.cpp's own server instead
(bench.llama_server.LlamaServer: the packaged Q4 GGUF, `--parallel 8 --cont-batching`, a
thread per core), the fastest server there is for this model on a CPU (#37): its target
is tokens/s >= 0.95 x direct; its results go to bench/results/upstream-llama-server.json.

Starts `transformers serve` (tests.support.upstreams.TransformersServe: the converted weights
chatsite itself loads, SmolLM2-135M-Instruct, on CPU in float32, with continuous batching
unless --no-continuous-batching, its paged cache sized for the highest level), then
chatsite (daphne, its own SQLite database) with CHAT_UPSTREAMS naming that server as the
model `smol-upstream`. Both ways to the model are warmed up as bench.concurrency does (the
first request alone, then a burst at the highest level). Then, level by level, `--rounds`
rounds each run bench.concurrency's closed loop (streaming chat completions, greedy,
`--max-tokens`, --requests of them, default max(2N, 8)) straight at the server and then
through chatsite, the order swapped every round, so that a drift of the shared machine
falls on both alike. The two ways share one model server, which only ever serves one of
them at a time.

Per level, the medians over the rounds of: aggregate tokens/s of chatsite ÷ direct, and
chatsite - direct for the median time to first content chunk and the median gap between
content chunks. Targets: ratio >= 0.97, TTFT +10 ms at most, gap +1 ms at most, no failed
request. Writes bench/results/upstream.json; exits 1 when a target is missed.

`--server-cpus 1` runs the model server on CPU 1 alone (`taskset`), and chatsite and this
client on the others, as when the model server has a machine (or a GPU) of its own: then
chatsite's work takes no time from the model's, and the figures are chatsite's own cost.
Without it the three share every core, and at 8 streams chatsite's CPU slows the model.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.concurrency import (
    RESULTS_DIR,
    Target,
    add_load_arguments,
    bench_api_key,
    load_settings,
    process_memory_mb,
    requests_for,
    run_level,
    warm_up,
    without_records,
)
from bench.llama_server import LlamaServer
from tests.support.livesite import LiveSite, log_errors
from tests.support.upstreams import TransformersServe

RESULTS = Path(os.environ.get("BENCH_RESULTS_DIR") or RESULTS_DIR) / "upstream.json"
PUBLIC_MODEL = "smol-upstream"
# chatsite tokens/s ÷ direct tokens/s, at least, by server (#16 and #37)
THROUGHPUT_TARGETS = {"transformers": 0.97, "llama-server": 0.95}
TTFT_TARGET_MS = 10.0  # chatsite TTFT median - direct TTFT median, at most
GAP_TARGET_MS = 1.0  # chatsite chunk-gap median - direct chunk-gap median, at most


@dataclass(frozen=True)
class Way:
    """One way to the model: the server requests go to, and the process whose memory counts."""

    name: str
    target: Target
    pid: int


def site_env(upstream: TransformersServe | LlamaServer, max_level: int) -> dict[str, str]:
    """chatsite's environment: the upstream as its model `smol-upstream`, room for every stream."""
    entry = {
        "model": PUBLIC_MODEL,
        "base_url": upstream.base_url,
        "upstream_model": upstream.model,
        "api_key": "",
        "max_concurrent": max_level,
    }
    return {"CHAT_UPSTREAMS": json.dumps([entry])}


def parse_cpus(text: str) -> set[int]:
    """`taskset -c` form (`1`, `0,2`, `2-3`) as a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def pin_process(pid: int, cpus: set[int]) -> None:
    """Every thread of a process on `cpus`; the threads it starts later inherit it."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)


def measure_level(ways: list[Way], level: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """`--rounds` rounds of one level on each way in turn, the order swapped every round."""
    rounds = []
    for number in range(1, args.rounds + 1):
        order = ways if number % 2 else ways[::-1]
        measured = {}
        for way in order:
            measured[way.name] = asyncio.run(
                run_level(
                    way.target,
                    level,
                    requests_for(level, args.requests),
                    args.max_tokens,
                    client=args.client,
                    server_pid=way.pid,
                )
            )
            print_measured(level, number, way.name, measured[way.name])
        rounds.append({"order": [way.name for way in order], **{n: without_records(m) for n, m in measured.items()}})
    return rounds


def difference_ms(chatsite: float | None, direct: float | None) -> float | None:
    return None if chatsite is None or direct is None else (chatsite - direct) * 1000


def comparison(direct: dict[str, Any], chatsite: dict[str, Any]) -> dict[str, Any]:
    """One round's figures of chatsite against the direct way's."""
    ratio = chatsite["agg_tokens_per_s"] / direct["agg_tokens_per_s"] if direct["agg_tokens_per_s"] else None
    return {
        "tokens_per_s_ratio": ratio,
        "ttft_median_diff_ms": difference_ms(chatsite["ttft_median_s"], direct["ttft_median_s"]),
        "gap_median_diff_ms": difference_ms(chatsite["gap_median_s"], direct["gap_median_s"]),
        "errors": direct["errors"] + chatsite["errors"],
    }


def over_rounds(rounds: list[dict[str, Any]], throughput_target: float) -> dict[str, Any]:
    """A level's medians over its rounds' comparisons, and the targets on them."""

    def median(key: str) -> float | None:
        values = [r[key] for r in rounds if r[key] is not None]
        return statistics.median(values) if values else None

    ratio, ttft_ms, gap_ms = median("tokens_per_s_ratio"), median("ttft_median_diff_ms"), median("gap_median_diff_ms")
    targets = {
        f"chatsite tokens/s >= {throughput_target} x direct": ratio is not None and ratio >= throughput_target,
        f"TTFT median chatsite - direct <= +{TTFT_TARGET_MS:.0f} ms": ttft_ms is not None and ttft_ms <= TTFT_TARGET_MS,
        f"gap median chatsite - direct <= +{GAP_TARGET_MS:.0f} ms": gap_ms is not None and gap_ms <= GAP_TARGET_MS,
        "no failed request": all(r["errors"] == 0 for r in rounds),
    }
    return {
        "tokens_per_s_ratio": ratio,
        "ttft_median_diff_ms": ttft_ms,
        "gap_median_diff_ms": gap_ms,
        "targets": targets,
    }


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def print_measured(level: int, number: int, way: str, measured: dict[str, Any]) -> None:
    chunks = measured["content_chunks"]
    print(
        f"level {level:>3}  round {number}  {way:<9}{measured['requests']:>4} requests{measured['errors']:>3} errors"
        f"{measured['agg_tokens_per_s']:>8.1f} tok/s  TTFT med {_ms(measured['ttft_median_s']):>7} ms"
        f"  gap med {_ms(measured['gap_median_s']):>6} ms"
        f"  {measured['completion_tokens'] / chunks if chunks else 0:.2f} tok/chunk",
        flush=True,
    )
    for message in measured["error_messages"]:
        print(f"    failed: {message}", flush=True)


def print_level(level: int, compared: dict[str, Any]) -> None:
    def shown(value: float | None, form: str) -> str:
        return "-" if value is None else form.format(value)

    print(
        f"level {level}: chatsite ÷ direct tok/s {shown(compared['tokens_per_s_ratio'], '{:.3f}')}; "
        f"TTFT median {shown(compared['ttft_median_diff_ms'], '{:+.1f} ms')}; "
        f"gap median {shown(compared['gap_median_diff_ms'], '{:+.2f} ms')}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_load_arguments(parser)
    parser.set_defaults(levels=[1, 8])
    parser.add_argument("--rounds", type=int, default=2, help="rounds per level on each way, alternated")
    parser.add_argument("--server", choices=sorted(THROUGHPUT_TARGETS), default="transformers")
    parser.add_argument(
        "--continuous-batching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run `transformers serve --continuous-batching` (default), or its sequential generate()",
    )
    parser.add_argument(
        "--server-cpus",
        help="run the model server on these CPUs (taskset -c form), chatsite and the client on the rest",
    )
    parser.add_argument("--results", type=Path, help="where the JSON goes")
    args = parser.parse_args()
    if args.results is None:
        args.results = RESULTS if args.server == "transformers" else RESULTS.with_name(f"upstream-{args.server}.json")
    if args.rounds < 1:
        parser.error("--rounds is at least 1")
    server_cpus = parse_cpus(args.server_cpus) if args.server_cpus else None
    front_cpus = os.sched_getaffinity(0) - server_cpus if server_cpus else None
    if front_cpus == set():
        parser.error("--server-cpus leaves no CPU for chatsite and the client")
    max_level = max(args.levels)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")

    serve: TransformersServe | LlamaServer
    if args.server == "llama-server":
        serve = LlamaServer(parallel=max(8, max_level), cpus=args.server_cpus)
    else:
        serve = TransformersServe(
            continuous_batching=args.continuous_batching,
            max_streams=max_level,
            max_tokens=args.max_tokens,
            cpus=args.server_cpus,
        )
    with serve as upstream:
        print(f"{args.server}: ready after {upstream.ready_after_s:.1f} s", flush=True)
        with LiveSite(env=site_env(upstream, max_level)) as site:
            assert upstream.process is not None and site.process is not None
            if front_cpus:
                pin_process(site.process.pid, front_cpus)
                pin_process(os.getpid(), front_cpus)
            direct = Target(upstream.base_url.removesuffix("/v1"), "not-checked", upstream.model)
            ways = [
                Way("direct", direct, upstream.process.pid),
                Way("chatsite", Target(site.base_url, bench_api_key(site), PUBLIC_MODEL), site.process.pid),
            ]
            warmed = {}
            for way in ways:
                warmed[way.name] = asyncio.run(
                    warm_up(
                        way.target,
                        max_level,
                        args.max_tokens,
                        burst=args.warmup_burst,
                        client=args.client,
                        server_pid=way.pid,
                    )
                )
                print(f"{way.name} warmed up", flush=True)
            levels = {}
            for level in args.levels:
                measured = measure_level(ways, level, args)
                rounds = [{**r, **comparison(r["direct"], r["chatsite"])} for r in measured]
                levels[level] = {"rounds": rounds, **over_rounds(rounds, THROUGHPUT_TARGETS[args.server])}
                print_level(level, levels[level])
            servers = {
                args.server: {
                    "command": upstream.command,
                    "ready_after_s": upstream.ready_after_s,
                    "warm_up_s": upstream.warm_up_s,
                    "rss_mb_end": process_memory_mb(upstream.process.pid),
                    "log": log_errors(upstream.log()),
                },
                "chatsite": {
                    "ready_after_s": site.ready_after_s,
                    "rss_mb_end": process_memory_mb(site.process.pid),
                    "log": log_errors(site.log()),
                },
            }

    targets = {
        f"level {level}: {name}": met for level, found in levels.items() for name, met in found["targets"].items()
    }
    result = {
        "command": shlex.join(["python", "-m", "bench.upstream", *sys.argv[1:]]),
        "date": started,
        "cpu_count": os.cpu_count(),
        "loadavg_end": os.getloadavg(),
        "settings": {
            **load_settings(args),
            "rounds": args.rounds,
            "server": args.server,
            **(
                {"parallel": serve.parallel, "threads": serve.threads, "weights": "Q4 GGUF"}
                if isinstance(serve, LlamaServer)
                else {
                    "continuous_batching": args.continuous_batching,
                    "cb_num_blocks": serve.cache_blocks if args.continuous_batching else None,
                    "dtype": "float32",
                }
            ),
            "device": "cpu",
            "server_cpus": sorted(server_cpus) if server_cpus else "shared",
            "front_cpus": sorted(front_cpus) if front_cpus else "shared",
            "chatsite_model": PUBLIC_MODEL,
        },
        "servers": servers,
        "warmup": warmed,
        "levels": levels,
        "all_targets_met": all(targets.values()),
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")
    for name, met in targets.items():
        print(f"target {name}: {'met' if met else 'MISSED'}")
    print(f"results written to {args.results}")
    sys.exit(0 if result["all_targets_met"] else 1)


if __name__ == "__main__":
    main()
