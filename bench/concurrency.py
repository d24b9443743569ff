"""Throughput and latency of concurrent streams through the OpenAI-compatible API.

    python -m bench.concurrency [--scheduler batched|sequential] [--levels 1,4,8,32]
        [--requests N] [--max-tokens 128] [--max-concurrent N] [--device cpu] [--dtype auto]
        [--label NAME] [--client openai|httpx] [--url URL --api-key KEY]

For each concurrency level N, N client workers send streaming chat completions
(`POST /v1/chat/completions`, greedy, `max_tokens`) back to back — a closed loop — until
the level's requests are done (default max(2N, 8)). Request k uses prompt k of a
fixed list of 16 short ones, so worker i starts at prompt i and every run sends the same
prompt set. Warm-up first: one request alone, then a burst at the highest level.

Per request: time to first content chunk (TTFT), the gaps between content chunks, total
time, completion tokens (from the usage chunk) and content chunks. Per level: aggregate
tokens/s = completion tokens delivered by all requests ÷ the level's wall time, and the
medians / p95s of the above. Starts chatsite itself (daphne, its own SQLite database,
SmolLM2-135M-Instruct) unless --url names a running server. Writes the summary to
bench/results/concurrency-<label>.json (label: the scheduler unless given) and every
request's record to bench/results/raw/concurrency-<label>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import result_files
from tests.support.livesite import ROOT, LiveSite, unlimited_api_key

MODEL = "smollm2-135m-instruct"
RESULTS_DIR = Path(__file__).parent / "results"
DEFAULT_LEVELS = (1, 4, 8, 32)

# Varied, short and open-ended, so that most answers run to max_tokens.
PROMPTS = (
    "Explain how a bicycle gear system works.",
    "Write a short story about a lighthouse keeper.",
    "What are the main causes of ocean tides?",
    "Describe how to make a good cup of tea.",
    "Give me five tips for learning a new language.",
    "Why is the sky blue? Explain it to a child.",
    "Summarise the water cycle in a few paragraphs.",
    "Write a poem about autumn in the city.",
    "How does a refrigerator keep food cold?",
    "What should I pack for a week of hiking?",
    "Explain the difference between weather and climate.",
    "Describe a typical day in ancient Rome.",
    "How do vaccines train the immune system?",
    "Write a friendly email inviting neighbours to a picnic.",
    "What makes a good password, and why?",
    "Explain what a database index is and when to use one.",
)

# The account's limits, lifted so that only the server's capacity shapes the load.
# One content delta and/or a completion-token count, as one chunk of a stream carries them.
Delta = tuple[str | None, int | None]
StreamOpener = Callable[[str, int], AsyncIterator[Delta]]


@dataclass(frozen=True)
class Target:
    """An OpenAI-compatible server: base URL (without /v1), key and model name."""

    base_url: str
    api_key: str
    model: str


@dataclass
class RequestRecord:
    worker: int
    prompt: int
    started_s: float  # since the level began
    total_s: float = 0.0
    ttft_s: float | None = None
    completion_tokens: int | None = None  # from the usage chunk
    content_chunks: int = 0
    gaps_s: list[float] = field(default_factory=list)
    error: str | None = None


@asynccontextmanager
async def stream_opener(target: Target, client: str, concurrency: int) -> AsyncIterator[StreamOpener]:
    """A function that starts one streaming chat completion and yields its deltas.

    `openai` is the official client, as developers use it; `httpx` parses the SSE lines
    with json.loads alone, for loads where the client's own CPU time would count.
    """
    if client == "openai":
        import openai

        api = openai.AsyncOpenAI(base_url=f"{target.base_url}/v1", api_key=target.api_key, max_retries=0, timeout=600)
        async with api:
            yield lambda prompt, max_tokens: _openai_deltas(api, target.model, prompt, max_tokens)
    else:
        import httpx

        limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
        http = httpx.AsyncClient(base_url=target.base_url, timeout=httpx.Timeout(600, connect=30), limits=limits)
        headers = {"Authorization": f"Bearer {target.api_key}"}
        async with http:
            yield lambda prompt, max_tokens: _httpx_deltas(http, headers, target.model, prompt, max_tokens)


def _request_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def _openai_deltas(api: Any, model: str, prompt: str, max_tokens: int) -> AsyncIterator[Delta]:
    stream = await api.chat.completions.create(**_request_body(model, prompt, max_tokens))
    async with stream:
        async for chunk in stream:
            content = chunk.choices[0].delta.content if chunk.choices else None
            yield content, chunk.usage.completion_tokens if chunk.usage else None


async def _httpx_deltas(
    http: Any, headers: dict[str, str], model: str, prompt: str, max_tokens: int
) -> AsyncIterator[Delta]:
    body = _request_body(model, prompt, max_tokens)
    async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        if response.status_code != 200:
            await response.aread()
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"error event: {chunk['error']}")
            choices = chunk.get("choices") or []
            content = choices[0].get("delta", {}).get("content") if choices else None
            usage = chunk.get("usage")
            yield content, usage["completion_tokens"] if usage else None


async def timed_request(
    open_stream: StreamOpener, worker: int, prompt: int, max_tokens: int, level_start: float
) -> RequestRecord:
    """One streaming request, its chunks stamped as they arrive."""
    started = time.perf_counter()
    record = RequestRecord(worker=worker, prompt=prompt, started_s=started - level_start)
    last = started
    try:
        async for content, completion_tokens in open_stream(PROMPTS[prompt], max_tokens):
            if completion_tokens is not None:
                record.completion_tokens = completion_tokens
            if not content:
                continue
            now = time.perf_counter()
            if record.ttft_s is None:
                record.ttft_s = now - started
            else:
                record.gaps_s.append(now - last)
            record.content_chunks += 1
            last = now
    except Exception as error:  # a refused or broken stream is a result, not a crash
        record.error = f"{type(error).__name__}: {error}"
        if error.__cause__ is not None:  # the openai client's "Connection error." hides what broke
            record.error += f" ({type(error.__cause__).__name__}: {error.__cause__})"
        record.error = record.error[:500]
    record.total_s = time.perf_counter() - started
    return record


async def run_level(
    target: Target,
    concurrency: int,
    requests: int,
    max_tokens: int,
    *,
    client: str = "openai",
    server_pid: int | None = None,
) -> dict[str, Any]:
    """N workers in a closed loop until `requests` are done; the level's summary and records."""
    counter = itertools.count()
    records: list[RequestRecord] = []
    async with stream_opener(target, client, concurrency) as open_stream:

        async def worker(number: int) -> None:
            # Workers take request numbers in turn; each number is its prompt's index.
            while (index := next(counter)) < requests:
                records.append(await timed_request(open_stream, number, index % len(PROMPTS), max_tokens, level_start))

        cpu_start = time.process_time()
        level_start = time.perf_counter()
        await asyncio.gather(*(worker(number) for number in range(concurrency)))
        wall_s = time.perf_counter() - level_start
        client_cpu_s = time.process_time() - cpu_start
    return summarise(concurrency, records, wall_s, client_cpu_s, server_pid)


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile, q in 0..100; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarise(
    concurrency: int, records: list[RequestRecord], wall_s: float, client_cpu_s: float, server_pid: int | None
) -> dict[str, Any]:
    done = [r for r in records if r.error is None]
    # A stream without a usage chunk counts its content chunks: too few where chunks carry several tokens.
    tokens = sum(r.completion_tokens if r.completion_tokens is not None else r.content_chunks for r in done)
    ttfts = [r.ttft_s for r in done if r.ttft_s is not None]
    gaps = [gap for r in done for gap in r.gaps_s]
    totals = [r.total_s for r in done]
    return {
        "concurrency": concurrency,
        "requests": len(records),
        "errors": len(records) - len(done),
        # What failed, kept where the records are not (bench.upstream's results).
        "error_messages": sorted({r.error for r in records if r.error is not None}),
        "missing_usage": sum(r.completion_tokens is None for r in done),
        "completion_tokens": tokens,
        "content_chunks": sum(r.content_chunks for r in done),
        "wall_s": wall_s,
        "agg_tokens_per_s": tokens / wall_s if wall_s else 0.0,
        "ttft_median_s": percentile(ttfts, 50),
        "ttft_p95_s": percentile(ttfts, 95),
        "gap_median_s": percentile(gaps, 50),
        "gap_p95_s": percentile(gaps, 95),
        "total_median_s": percentile(totals, 50),
        "client_cpu_s": client_cpu_s,
        "server_rss_mb": process_memory_mb(server_pid),
        "records": [_record_json(r) for r in sorted(records, key=lambda r: r.started_s)],
    }


def _record_json(record: RequestRecord) -> dict[str, Any]:
    """The record with its times to 10 µs, which keeps the results files readable."""
    data = asdict(record)
    for key in ("started_s", "total_s", "ttft_s"):
        if data[key] is not None:
            data[key] = round(data[key], 5)
    data["gaps_s"] = [round(gap, 5) for gap in record.gaps_s]
    return data


def process_memory_mb(pid: int | None) -> dict[str, float] | None:
    """Resident and peak resident memory of a local process, from /proc (Linux)."""
    if pid is None:
        return None
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {key: int(fields[name].split()[0]) / 1024 for key, name in (("rss", "VmRSS"), ("peak", "VmHWM"))}


def requests_for(concurrency: int, requests: int | None) -> int:
    """Requests sent at a level: --requests (at least one per worker), else max(2N, 8)."""
    return max(requests, concurrency) if requests else max(2 * concurrency, 8)


async def warm_up(
    target: Target, max_level: int, max_tokens: int, *, burst: bool, client: str, server_pid: int | None
) -> dict[str, Any]:
    """The first request alone (timed: a server's first one can be slow), then, with
    `burst`, one request per stream of the highest level, all at once, so that the
    server has met its batch shapes and cache sizes before anything is measured."""
    first = await run_level(target, 1, 1, max_tokens, client=client)
    if first["errors"]:
        raise RuntimeError(f"first request failed: {first['records'][0]['error']}")
    warmed: dict[str, Any] = {"first_request": first["records"][0], "burst_wall_s": None}
    if burst:
        batch = await run_level(target, max_level, max_level, max_tokens, client=client)
        if batch["errors"]:
            raise RuntimeError(f"warm-up burst failed: {[r['error'] for r in batch['records'] if r['error']][:3]}")
        warmed["burst_wall_s"] = batch["wall_s"]
    warmed["server_rss_mb"] = process_memory_mb(server_pid)
    return warmed


async def run_levels(
    target: Target,
    levels: list[int],
    max_tokens: int,
    *,
    requests: int | None = None,
    client: str = "openai",
    server_pid: int | None = None,
    warmup_burst: bool = True,
) -> dict[str, Any]:
    """Warm up, then run each level in turn, printing a line as each ends."""
    warmed = await warm_up(target, max(levels), max_tokens, burst=warmup_burst, client=client, server_pid=server_pid)
    print(f"first request {warmed['first_request']['total_s']:.1f} s", end="")
    if warmed["burst_wall_s"] is not None:
        print(f"; warm-up burst of {max(levels)} in {warmed['burst_wall_s']:.1f} s", end="")
    print(flush=True)
    results = []
    print_header()
    for level in levels:
        result = await run_level(
            target, level, requests_for(level, requests), max_tokens, client=client, server_pid=server_pid
        )
        print_row(result)
        results.append(result)
    return {"warmup": warmed, "levels": results}


COLUMNS = (
    ("level", 6),
    ("requests", 9),
    ("errors", 7),
    ("agg tok/s", 10),
    ("TTFT med", 9),
    ("TTFT p95", 9),
    ("gap med", 8),
    ("gap p95", 8),
    ("total med", 10),
    ("tok/chunk", 10),
)


def print_header() -> None:
    print("times in s; agg tok/s: completion tokens of all requests / the level's wall time")
    print("".join(f"{name:>{width}}" for name, width in COLUMNS))


def print_row(level: dict[str, Any]) -> None:
    def seconds(value: float | None, width: int) -> str:
        return f"{value:>{width}.3f}" if value is not None else f"{'-':>{width}}"

    chunks = level["content_chunks"]
    per_chunk = level["completion_tokens"] / chunks if chunks else 0.0
    print(
        f"{level['concurrency']:>6}{level['requests']:>9}{level['errors']:>7}{level['agg_tokens_per_s']:>10.1f}"
        f"{seconds(level['ttft_median_s'], 9)}{seconds(level['ttft_p95_s'], 9)}"
        f"{seconds(level['gap_median_s'], 8)}{seconds(level['gap_p95_s'], 8)}"
        f"{seconds(level['total_median_s'], 10)}{per_chunk:>10.2f}",
        flush=True,
    )


def measure(target: Target, args: argparse.Namespace, server_pid: int | None = None) -> dict[str, Any]:
    """The whole load, as the flags of add_load_arguments describe it."""
    return asyncio.run(
        run_levels(
            target,
            args.levels,
            args.max_tokens,
            requests=args.requests,
            client=args.client,
            server_pid=server_pid,
            warmup_burst=args.warmup_burst,
        )
    )


def without_records(level: dict[str, Any]) -> dict[str, Any]:
    """A level's summary; its per-request records stay out of the results file."""
    return {key: value for key, value in level.items() if key != "records"}


def write_results(label: str, payload: dict[str, Any]) -> Path:
    """bench/results/concurrency-<label>.json, or under $BENCH_RESULTS_DIR when set: the
    levels' summaries there, their requests' records in raw/ beside it."""
    path = results_dir() / f"concurrency-{label}.json"
    levels = payload["levels"]
    summary = {**payload, "levels": [without_records(level) for level in levels]}
    raw = {
        "label": label,
        "date": payload["date"],
        "levels": [{"concurrency": level["concurrency"], "records": level["records"]} for level in levels],
    }
    result_files.write(path, summary, raw)
    return path


def write_server_log(label: str, log: str) -> Path:
    """The server's log beside its results (concurrency-<label>.server.log): why a level
    failed is there, not in the clients' errors."""
    path = results_dir() / f"concurrency-{label}.server.log"
    path.write_text(log)
    return path


def results_dir() -> Path:
    directory = Path(os.environ.get("BENCH_RESULTS_DIR") or RESULTS_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def parse_levels(text: str) -> list[int]:
    levels = [int(part) for part in text.split(",") if part.strip()]
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError("levels are positive integers, e.g. 1,4,8,32")
    return levels


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """The load's flags, shared with bench.peer."""
    parser.add_argument("--levels", type=parse_levels, default=list(DEFAULT_LEVELS), help="e.g. 1,4,8,32")
    parser.add_argument("--requests", type=int, help="requests per level (default max(2N, 8))")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--client", choices=("openai", "httpx"), default="openai")
    parser.add_argument(
        "--no-warmup-burst",
        dest="warmup_burst",
        action="store_false",
        help="warm up with one request only, not also a burst at the highest level",
    )


def load_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "levels": args.levels,
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "client": args.client,
        "warmup_burst": args.warmup_burst,
        "prompts": len(PROMPTS),
        "temperature": 0,
    }


def site_env(args: argparse.Namespace) -> dict[str, str]:
    """The model settings of chatsite's environment, from the flags."""
    env = {"CHAT_MODEL": args.model, "GENERATION_SCHEDULER": args.scheduler}
    if args.max_concurrent:
        env["GENERATION_MAX_CONCURRENT"] = str(args.max_concurrent)
    if args.device:
        env["CHAT_DEVICE"] = args.device
    if args.dtype:
        env["CHAT_DTYPE"] = args.dtype
    return env


def prepare_model(env: dict[str, str]) -> None:
    """Download and convert the model once, before any server start is timed."""
    subprocess.run([sys.executable, "manage.py", "prepare_model"], cwd=ROOT, env={**os.environ, **env}, check=True)


def started_site(args: argparse.Namespace) -> LiveSite:
    """chatsite under daphne, configured from the flags, with the model prepared first."""
    env = site_env(args)
    prepare_model(env)
    # Compiling the static step (GENERATION_COMPILE) holds readiness for minutes on a CPU.
    return LiveSite(env=env, ready_timeout=900)


def resolved_dtype(args: argparse.Namespace) -> str:
    """The weights' dtype the server chose, e.g. `bfloat16` for CHAT_DTYPE=auto on this CPU."""
    from inference.loading import resolve_device, weights_dtype_for

    device = resolve_device(args.device or os.environ.get("CHAT_DEVICE", "auto"))
    dtype = args.dtype or os.environ.get("CHAT_DTYPE", "auto")
    return str(weights_dtype_for(device, dtype, os.environ.get("CHAT_QUANTIZATION", "none"))).split(".")[-1]


def bench_api_key(site: LiveSite) -> str:
    """A user whose plan lets the load through, and an API key for it."""
    return unlimited_api_key(site)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_load_arguments(parser)
    parser.add_argument("--scheduler", choices=("batched", "sequential"), default="batched")
    parser.add_argument("--max-concurrent", type=int, help="GENERATION_MAX_CONCURRENT (default: the app's)")
    parser.add_argument("--device", help="CHAT_DEVICE (default: the app's, auto)")
    parser.add_argument("--dtype", help="CHAT_DTYPE (default: the app's, auto)")
    parser.add_argument("--model", default=MODEL, help="CHAT_MODEL, and the model field of each request")
    parser.add_argument("--label", help="results file suffix (default: the scheduler)")
    parser.add_argument("--url", help="bench this running server instead of starting chatsite")
    parser.add_argument("--api-key", help="API key for --url")
    args = parser.parse_args()
    if args.url and not args.api_key:
        parser.error("--url needs --api-key")
    label = args.label or args.scheduler

    server: dict[str, Any] = {"url": args.url}
    if args.url:
        measured = measure(Target(args.url.rstrip("/"), args.api_key, args.model), args)
    else:
        with started_site(args) as site:
            assert site.process is not None
            pid = site.process.pid
            started_rss = process_memory_mb(pid)
            try:
                measured = measure(Target(site.base_url, bench_api_key(site), args.model), args, server_pid=pid)
            finally:
                print(f"server log written to {write_server_log(label, site.log())}")
            warm_rss = measured["warmup"]["server_rss_mb"]
            server.update(
                ready_after_s=site.ready_after_s,
                rss_mb={"started": started_rss, "warm": warm_rss, "end": process_memory_mb(pid)},
            )

    payload = {
        "label": label,
        "server": "chatsite",
        "command": "python -m bench.concurrency " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "cpu_count": os.cpu_count(),
        "settings": {
            **load_settings(args),
            "model": args.model,
            "scheduler": args.scheduler,
            "max_concurrent": args.max_concurrent,
            "device": args.device or os.environ.get("CHAT_DEVICE", "auto"),
            "dtype": resolved_dtype(args),
            "cuda_graphs": os.environ.get("GENERATION_CUDA_GRAPHS", "auto"),
            "compile": os.environ.get("GENERATION_COMPILE", "0"),
            "threads": os.environ.get("GENERATION_THREADS", "a core each"),
            "quantization": os.environ.get("CHAT_QUANTIZATION", "none"),
        },
        "server_process": server,
        **measured,
    }
    path = write_results(label, payload)
    print(f"results written to {path}")


if __name__ == "__main__":
    main()
