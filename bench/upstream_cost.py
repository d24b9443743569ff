"""chatsite's own cost in front of a model server, apart from the model's.

    python -m bench.upstream_cost [--before REV] [--levels 1,8] [--rounds 5] [--chunks 128]
        [--gap-ms 20] [--results bench/results/upstream_cost.json]

bench.upstream compares chatsite with the model server called directly, but on this
machine the model server's own speed drifts by more than chatsite adds. Here the model
server is scripted (bench.lockstep_server, a subprocess: no model, all its streams get a
chunk together every --gap-ms, as a batching server's steps do, and it logs when each
request arrives), so what is measured is chatsite's own work. Per level N, each round
sends a burst of N concurrent streaming chat completions (the official `openai` client,
--chunks chunks each) straight to the server, then through chatsite (daphne, its own
SQLite database, the server as CHAT_UPSTREAMS), and with --before REV through REV's
chatsite too (its tracked files exported, this virtual environment), the order swapped
every round. Figures per way, medians over the rounds:

- `cpu_ms_per_chunk`: chatsite's CPU time (all threads) over the burst ÷ chunks, the
  door's work for each request included;
- `wakeups_per_chunk`: chatsite's context switches (all threads, voluntary and not) ÷
  chunks: each is a thread put to sleep or woken, which on a machine that chatsite shares
  with a model server preempts the model's threads;
- `server_cpu_ms_per_chunk`: the scripted server's CPU, the same whoever calls it;
- `arrival_ms`: from sending the burst to the median request reaching the server;
- `ttft_ms`, `gap_ms`: medians, as the client sees them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from bench.concurrency import parse_levels
from bench.door import export
from bench.fanout import process_cpu_s
from tests.support.livesite import ROOT, LiveSite, free_port, stop_process, unlimited_api_key
from tests.support.upstreams import wait_until_answering

RESULTS = ROOT / "bench" / "results" / "upstream_cost.json"
MODEL = "lockstep"


def context_switches(pid: int) -> int:
    """Voluntary and involuntary context switches of all of a process's threads."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            for line in (task / "status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
    return total


async def burst(base_url: str, api_key: str, model: str, level: int, chunks: int) -> dict[str, Any]:
    """`level` streams at once; when each was sent, its TTFT and its gaps between chunks."""
    api = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=120)
    ttfts: list[float] = []
    gaps: list[float] = []

    async def stream(number: int) -> None:
        started = time.monotonic()
        last = None
        response = await api.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"Question {number}"}],
            max_tokens=chunks,
            temperature=0,
            stream=True,
        )
        async for piece in response:
            if piece.choices and piece.choices[0].delta.content:
                now = time.monotonic()
                if last is None:
                    ttfts.append(now - started)
                else:
                    gaps.append(now - last)
                last = now

    async with api:
        sent = time.monotonic()
        await asyncio.gather(*(stream(number) for number in range(level)))
    return {"sent": sent, "ttfts": ttfts, "gaps": gaps}


def measure(way: str, target: tuple[str, str, str], pids: dict[str, int], arrivals: Path, args: Any, level: int):
    """One burst on one way, with the CPU and context switches it cost each process."""
    base_url, api_key, model = target
    site_pid = pids.get(way)
    before = (process_cpu_s(site_pid), context_switches(site_pid)) if site_pid else (0.0, 0)
    server_cpu = process_cpu_s(pids["server"])
    seen = len(arrivals.read_text().splitlines())
    result = asyncio.run(burst(base_url, api_key, model, level, args.chunks))
    chunks = level * args.chunks
    arrived = [json.loads(line)["arrived"] for line in arrivals.read_text().splitlines()[seen:]]
    figures = {
        "server_cpu_ms_per_chunk": 1000 * (process_cpu_s(pids["server"]) - server_cpu) / chunks,
        "arrival_ms": 1000 * (statistics.median(arrived) - result["sent"]),
        "ttft_ms": 1000 * statistics.median(result["ttfts"]),
        "gap_ms": 1000 * statistics.median(result["gaps"]),
    }
    if site_pid:
        figures["cpu_ms_per_chunk"] = 1000 * (process_cpu_s(site_pid) - before[0]) / chunks
        figures["wakeups_per_chunk"] = (context_switches(site_pid) - before[1]) / chunks
    return figures


def start_lockstep_server(stack: contextlib.ExitStack, scratch: Path, chunks: int, gap_s: float):
    """The scripted server (stopped with `stack`): its process, URL, arrivals log, and the
    CHAT_UPSTREAMS environment of a chatsite in front of it."""
    arrivals = scratch / "arrivals.jsonl"
    arrivals.touch()
    port = free_port()
    serve = ["bench.lockstep_server", str(port), str(arrivals), str(chunks), str(gap_s)]
    server = subprocess.Popen([sys.executable, "-m", *serve], cwd=ROOT)
    stack.callback(stop_process, server)
    server_url = f"http://127.0.0.1:{port}"
    wait_until_answering(
        server, f"{server_url}/v1/models", time.monotonic() + 30, name="lockstep server", log=lambda: ""
    )
    upstream = {"model": MODEL, "base_url": f"{server_url}/v1", "upstream_model": MODEL, "max_concurrent": 64}
    return server, server_url, arrivals, {"CHAT_UPSTREAMS": json.dumps([upstream])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="a revision to measure too, in the same run")
    parser.add_argument("--levels", type=parse_levels, default=[1, 8])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chunks", type=int, default=128)
    parser.add_argument("--gap-ms", type=float, default=20.0)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chatsite-upstream-cost-")))
        server, server_url, arrivals, env = start_lockstep_server(stack, scratch, args.chunks, args.gap_ms / 1000)

        roots = {"chatsite": ROOT}
        if args.before:
            roots = {"before": export(args.before, scratch / "before"), **roots}
        targets = {"direct": (server_url, "not-checked", MODEL)}
        pids = {"server": server.pid}
        for name, root in roots.items():
            site = stack.enter_context(LiveSite(env=env, root=root))
            assert site.process is not None
            targets[name], pids[name] = (site.base_url, unlimited_api_key(site), MODEL), site.process.pid

        levels: dict[int, dict[str, Any]] = {}
        for level in args.levels:
            for way, target in targets.items():  # warm-up: connections, imports, the first request's work
                measure(way, target, pids, arrivals, args, level)
            rounds: dict[str, list[dict[str, float]]] = {way: [] for way in targets}
            for number in range(args.rounds):
                for way in list(targets)[:: 1 if number % 2 == 0 else -1]:
                    rounds[way].append(measure(way, targets[way], pids, arrivals, args, level))
            levels[level] = {
                way: {key: round(statistics.median(r[key] for r in measured), 3) for key in measured[0]}
                for way, measured in rounds.items()
            }
            for way, figures in levels[level].items():
                print(f"level {level:>2}  {way:<9} " + "  ".join(f"{k} {v}" for k, v in figures.items()), flush=True)
            levels[level]["rounds"] = rounds  # type: ignore[assignment]

    result = {
        "command": shlex.join(["python", "-m", "bench.upstream_cost", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpu_count": os.cpu_count(),
        "loadavg_end": os.getloadavg(),
        "settings": {"chunks": args.chunks, "gap_ms": args.gap_ms, "rounds": args.rounds, "before": args.before},
        "levels": levels,
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results written to {args.results}")


if __name__ == "__main__":
    main()
