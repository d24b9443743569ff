"""Scale-out: two web processes and one generation worker hold thousands of streams at once.

    .venv/bin/python -m bench.scale_out [--streams 2000] [--rate 5] [--tokens 1500]
        [--ramp-concurrency 32] [--timeout 1500] [--results bench/results/scale_out.json] [--logs DIR]

One GENERATION_BACKEND=celery deployment on this machine: web A and web B (daphne, no
model) and one Celery generation worker running the synthetic model at `--rate` words/s
per stream, all on one database (PostgreSQL beside DATABASE_URL when it names one, else
SQLite) and one Redis (REDIS_URL, default redis://127.0.0.1:6379/0; keys under a prefix of
their own, deleted afterwards). GENERATION_MAX_CONCURRENT = `--streams`: every answer runs
at once, none waits in the queue.

One user with its plan's limits lifted and `--streams` conversations with
max_tokens=`--tokens`. Stream n's prompt is posted to web A (n even) or B (n odd), the way
the HTMX form does, `--ramp-concurrency` at a time; right after its POST, the answer's SSE
stream is opened and read to its `done` event: half of each web's answers through the same
web, half through the other one (any web serves any stream). So 1,000 streams per web at
the default size. The defaults give each stream 300 s, so that they overlap: opening
them takes a while (on two cores, 500 streams at 5 words/s took 21 s to open).

Nothing lost: every stream ends with `done`, holds exactly `--tokens` words, the synthetic
model's words in order, under strictly increasing ids, and its saved answer is complete
with that same text (the checks of bench.fanout). Reports the peak of streams delivering
at once, delivered tokens/s against `--streams` x `--rate` (steady state: all streams on,
none done), the inter-event gaps, the ramp (POST + SSE response head per stream: p50 and
max; until the last stream's first event), each process's RSS, and Redis's used_memory
and clients sampled every second. Targets: every stream complete; peak concurrent streams
≥ 95 % of `--streams`. Writes bench/results/scale_out.json, and the once-a-second samples
to bench/results/raw/scale_out.json; exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

from bench import result_files
from bench.fanout import (
    Counters,
    StreamResult,
    chat_figures,
    cookie_header,
    lift_limits,
    memory,
    open_chat_stream,
    post_prompt,
    process_cpu_s,
    raise_open_files,
    read_chat_stream,
    run_all,
    saved_answers,
    start_watchdog,
    use_site_settings,
)
from tests.support.livesite import (
    ChatClient,
    LiveSite,
    LiveWorker,
    keep_logs,
    log_errors,
    scratch_database,
    scratch_redis_prefix,
)

RESULTS = Path(__file__).parent / "results" / "scale_out.json"
OVERLAP_TARGET = 0.95  # of --streams delivering at the same moment
SAMPLE_EVERY_S = 1.0
WEB_NAMES = ("A", "B")


def deployment_env(args: argparse.Namespace, database_url: str, redis_url: str, prefix: str) -> dict[str, str]:
    """One environment for both web processes and the worker."""
    return {
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "REDIS_KEY_PREFIX": prefix,
        "GENERATION_BACKEND": "celery",
        "CHAT_MODEL": "synthetic",
        "CHAT_ENABLE_SYNTHETIC": "1",
        "CHAT_SYNTHETIC_TOKENS_PER_S": str(args.rate),
        "GENERATION_MAX_CONCURRENT": str(args.streams),
        # Nothing waits (a row per stream); a worker runs a task thread per row and queue place.
        "GENERATION_MAX_QUEUE": "64",
    }


def routes(streams: int) -> list[tuple[int, int]]:
    """(web posted to, web read from) per stream: alternate webs, and half of each web's
    answers are read through the other web."""
    return [(n % 2, n % 2 if (n // 2) % 2 == 0 else 1 - n % 2) for n in range(streams)]


async def run_streams(
    ports: list[int],
    conversation_ids: list[str],
    cookies: dict[str, str],
    pids: dict[str, int],
    redis_client: redis.Redis,
    args: argparse.Namespace,
    counters: Counters,
) -> tuple[list[StreamResult], list[dict[str, Any]]]:
    """Post each prompt and read its stream to `done`; sample the servers meanwhile."""
    results = [StreamResult() for _ in conversation_ids]
    opening = asyncio.Semaphore(args.ramp_concurrency)
    cookie = cookie_header(cookies)

    async def stream(conversation_id: str, route: tuple[int, int], result: StreamResult) -> None:
        origin, reader = route
        try:
            async with opening:  # the ramp: a POST and its stream's response head
                result.opened_at = time.perf_counter()
                stream_url = await post_prompt(ports[origin], conversation_id, cookies, counters)
                response = await open_chat_stream(ports[reader], stream_url, cookie, result, counters)
                result.setup_s = time.perf_counter() - result.opened_at
            if response is not None:
                await read_chat_stream(response, result)
        except Exception as error:
            result.error = f"{type(error).__name__}: {error}"

    samples: list[dict[str, Any]] = []
    streaming = asyncio.ensure_future(
        run_all(
            (stream(c, route, r) for c, route, r in zip(conversation_ids, routes(len(results)), results, strict=True)),
            args.timeout,
        )
    )
    started = time.perf_counter()
    while not streaming.done():
        samples.append(await asyncio.to_thread(sample, started, results, pids, redis_client))
        await asyncio.wait([streaming], timeout=SAMPLE_EVERY_S)
    counters.timed_out = streaming.result()
    return results, samples


def sample(started: float, results: list[StreamResult], pids: dict[str, int], client: redis.Redis) -> dict[str, Any]:
    """Streams open now (first event seen, not ended), each process's RSS and open files
    (sockets, database handles), Redis's memory and clients."""
    info = {**client.info("memory"), **client.info("clients")}
    rss: dict[str, float | None] = {}
    files: dict[str, int | None] = {}
    for name, pid in pids.items():
        try:
            rss[name] = round(memory(pid)["rss_mb"], 1)
            files[name] = len(os.listdir(f"/proc/{pid}/fd"))
        except (OSError, KeyError):
            rss[name] = files[name] = None
    return {
        "t_s": round(time.perf_counter() - started, 2),
        "open": sum(r.first_at is not None and not r.ended and r.error is None for r in results),
        "posted": sum(r.opened_at is not None for r in results),
        "rss_mb": rss,
        "open_files": files,
        "redis_used_memory_mb": round(info["used_memory"] / 2**20, 1),
        "redis_clients": info["connected_clients"],
    }


def route_counts(results: list[StreamResult]) -> dict[str, dict[str, int]]:
    """Streams and complete streams per (web posted to → web read from)."""
    counts: dict[str, dict[str, int]] = {}
    for (origin, reader), result in zip(routes(len(results)), results, strict=True):
        pair = counts.setdefault(f"{WEB_NAMES[origin]}->{WEB_NAMES[reader]}", {"streams": 0, "complete": 0})
        pair["streams"] += 1
        pair["complete"] += result.done
    return counts


def run(args: argparse.Namespace, redis_url: str, children: list[subprocess.Popen[bytes]]) -> dict[str, Any]:
    with scratch_database() as database_url, scratch_redis_prefix(redis_url, "chatsite-scale-out") as prefix:
        env = deployment_env(args, database_url, redis_url, prefix)
        with LiveSite(env=env) as web_a, LiveSite(env=env) as web_b:
            webs = [web_a, web_b]
            assert web_a.process is not None and web_b.process is not None
            children += [web_a.process, web_b.process]
            worker_started = time.monotonic()
            with LiveWorker(web_a.env) as worker:
                assert worker.process is not None
                children.append(worker.process)
                worker_ready_s = time.monotonic() - worker_started
                use_site_settings(web_a.env, ("DJANGO_SECRET_KEY", *env))
                from django.contrib.auth import get_user_model
                from django.db import connections

                from generation.models import Conversation

                client = ChatClient(web_a.base_url)
                client.signup("scale-out")
                cookies = {name: client.http.cookies[name] for name in ("sessionid", "csrftoken")}
                user = get_user_model().objects.get(username="scale-out")
                lift_limits(user, readers=args.streams, tokens=args.tokens)
                conversations = Conversation.objects.bulk_create(
                    Conversation(user=user, model="synthetic", max_tokens=args.tokens) for _ in range(args.streams)
                )
                connections.close_all()  # no open SQLite connection in this process while the site writes

                pids = {"web_a": web_a.process.pid, "web_b": web_b.process.pid, "worker": worker.process.pid}
                redis_client = redis.Redis.from_url(redis_url)
                redis_before_mb = redis_client.info("memory")["used_memory"] / 2**20
                cpu_before = {name: process_cpu_s(pid) for name, pid in pids.items()}
                bench_cpu_before = time.process_time()
                load = os.getloadavg()
                counters = Counters()
                results, samples = asyncio.run(
                    run_streams(
                        [web.port for web in webs],
                        [str(c.id) for c in conversations],
                        cookies,
                        pids,
                        redis_client,
                        args,
                        counters,
                    )
                )
                bench_cpu_s = time.process_time() - bench_cpu_before
                processes = {
                    name: {**memory(pid), "cpu_s": process_cpu_s(pid) - cpu_before[name]} for name, pid in pids.items()
                }
                redis_after_mb = redis_client.info("memory")["used_memory"] / 2**20
                redis_client.close()
                saved = saved_answers(results)
                connections.close_all()
                processes["web_a"]["log"] = log_errors(web_a.log())
                processes["web_b"]["log"] = log_errors(web_b.log())
                worker_log = worker.log()
                processes["worker"].update(
                    log=log_errors(worker_log),
                    ready_after_s=worker_ready_s,
                    generations_started=worker_log.count("Generating "),
                )
                keep_logs(args.logs, {"web-a": web_a.log_path, "web-b": web_b.log_path, "worker": worker.log_path})

    figures = chat_figures(results, saved, args.tokens, counters, args.streams * args.rate)
    opened = [r.opened_at for r in results if r.opened_at is not None]
    set_up = [r.opened_at + r.setup_s for r in results if r.opened_at is not None and r.setup_s is not None]
    peak_sample = max(samples, key=lambda s: s["open"], default=None)
    figures.update(
        expected_tokens_per_s=args.streams * args.rate,
        steady_ratio=(figures["steady_tokens_per_s"] or 0) / (args.streams * args.rate),
        open_all_s=(max(set_up) - min(opened)) if set_up and opened else None,
        stream_duration_s=args.tokens / args.rate,
        routes=route_counts(results),
        bench_cpu_s=bench_cpu_s,
        loadavg_before=load,
    )
    return {
        "env": env,
        "figures": figures,
        "processes": processes,
        "redis": {
            "used_memory_mb_before": redis_before_mb,
            "used_memory_mb_at_peak_open": peak_sample["redis_used_memory_mb"] if peak_sample else None,
            "used_memory_mb_max": max((s["redis_used_memory_mb"] for s in samples), default=None),
            "used_memory_mb_after": redis_after_mb,
            "clients_max": max((s["redis_clients"] for s in samples), default=None),
        },
        "open_files_max": {name: max((s["open_files"][name] or 0 for s in samples), default=None) for name in pids},
        "samples": samples,
    }


def print_table(result: dict[str, Any], args: argparse.Namespace) -> None:
    figures, processes, memory_mb = result["figures"], result["processes"], result["redis"]

    def number(value: Any, digits: int = 1) -> str:
        return "-" if value is None else f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"

    rows = [
        ("streams complete (all text, in order)", f"{figures['complete']:,}/{figures['streams']:,}", "all"),
        ("peak concurrent streams", number(figures["peak_concurrent_streams"]),
         f">= {OVERLAP_TARGET * args.streams:,.0f}"),
        ("steady state s (all streams on, none done)", number(figures["steady_s"], 2), ""),
        ("steady state tokens/s delivered", number(figures["steady_tokens_per_s"]),
         f"expected {number(figures['expected_tokens_per_s'])}"),
        ("whole window tokens/s delivered (live)", number(figures["tokens_per_s"]), ""),
        ("per-stream tokens/s (median)", number(figures["per_stream_tokens_per_s_median"]), f"rate {args.rate:g}"),
        ("tokens per token event", number(figures["tokens_per_event"], 2), ""),
        ("gap p50 / p99 / max ms", f"{number(figures['gap_p50_ms'])} / {number(figures['gap_p99_ms'])} / "
         f"{number(figures['gap_max_ms'])}", ""),
        ("open (POST + SSE head) p50 / max ms", f"{number(figures['setup_p50_ms'])} / "
         f"{number(figures['setup_max_ms'])}", ""),
        ("all streams opened after s", number(figures["open_all_s"], 2), ""),
        ("ramp s (until the last stream's 1st event)", number(figures["ramp_s"], 2),
         f"< {figures['stream_duration_s']:g} s a stream"),
        ("connect retries / client errors / timed out", f"{figures['connect_retries']} / {figures['errors']} / "
         f"{figures['timed_out_streams']}", ""),
        ("Redis used_memory MB before / at peak / max", f"{number(memory_mb['used_memory_mb_before'])} / "
         f"{number(memory_mb['used_memory_mb_at_peak_open'])} / {number(memory_mb['used_memory_mb_max'])}", ""),
        ("Redis clients (max)", number(memory_mb["clients_max"]), ""),
    ]  # fmt: skip
    for name in ("web_a", "web_b", "worker"):
        process = processes[name]
        rows.append((f"{name} RSS MB end / peak, CPU s", f"{number(process['rss_mb'])} / "
                     f"{number(process['peak_rss_mb'])}, {number(process['cpu_s'])}", ""))  # fmt: skip
    rows.append(("worker generations started", number(processes["worker"]["generations_started"]), ""))
    files = result["open_files_max"]
    rows.append(("open files max: web_a / web_b / worker", " / ".join(str(files[name]) for name in files), ""))
    print(f"{'figure':<46}{'measured':>30}{'target':>24}")
    for name, value, target in rows:
        print(f"{name:<46}{value:>30}{target:>24}")
    print(f"checks: {figures['checks']}")
    print(f"routes (posted to -> read from): {figures['routes']}")
    for name in ("web_a", "web_b", "worker"):
        for error, count in processes[name]["log"]["errors"].items():
            print(f"{name} log: {count} x {error}")
    for name, met in result["targets"].items():
        print(f"target {name}: {'met' if met else 'MISSED'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=2000, help="generations at once, half posted to each web")
    parser.add_argument("--rate", type=float, default=5.0, help="synthetic words per second per stream")
    parser.add_argument("--tokens", type=int, default=1500, help="words per answer (its max_tokens)")
    parser.add_argument("--ramp-concurrency", type=int, default=32, help="streams being opened at once")
    parser.add_argument("--timeout", type=float, default=1500.0, help="seconds the streams may take in all")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the JSON goes")
    parser.add_argument("--logs", type=Path, help="copy the web and worker logs into this folder")
    args = parser.parse_args()
    if args.streams < 2:
        parser.error("--streams is at least 2 (one per web process)")
    redis_url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"

    raise_open_files(args.streams)  # inherited by the web processes, which hold the sockets
    children: list[subprocess.Popen[bytes]] = []
    # Three server starts with migrations, the streams, the checks: then stop no matter what.
    start_watchdog(args.timeout + 600, children, name="bench.scale_out")
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    measured = run(args, redis_url, children)
    samples = measured.pop("samples")

    figures = measured["figures"]
    targets = {
        "every stream complete and in order": figures["complete"] == args.streams,
        f"peak concurrent streams >= {OVERLAP_TARGET:.0%} of streams": figures["peak_concurrent_streams"]
        >= OVERLAP_TARGET * args.streams,
    }
    result = {
        "command": shlex.join(["python", "-m", "bench.scale_out", *sys.argv[1:]]),
        "args": {**vars(args), "results": str(args.results), "logs": str(args.logs) if args.logs else None},
        "date": started,
        "cpu_count": os.cpu_count(),
        "redis_url": redis_url,
        **measured,
        "targets": targets,
        "all_targets_met": all(targets.values()),
    }
    result_files.write(args.results, result, {"command": result["command"], "date": started, "samples": samples})
    print_table(result, args)
    if figures["ramp_s"] is not None and figures["ramp_s"] > figures["stream_duration_s"]:
        print("note: opening took longer than a stream lasts; raise --tokens or lower --rate for more overlap")
    print(f"results written to {args.results}")
    sys.exit(0 if result["all_targets_met"] else 1)


if __name__ == "__main__":
    main()
