"""Where chatsite's web process spends its time streaming a model server's answers.

    python -m bench.upstream_profile [--server lockstep|llama-server] [--level 8] [--chunks 64]
        [--seconds 30] [--py-spy PATH] [--gil] [--raw PATH]
        [--results bench/results/upstream_profile.json]

bench.upstream_cost says how much CPU chatsite takes per chunk; this says on what. The
scripted server of that bench (bench.lockstep_server) serves bursts of --level streams
through chatsite for --seconds while `py-spy` (not a requirement: `pip install py-spy`)
samples every thread of chatsite's process 200 times a second. Samples are sorted into
the stages of a chunk's way by the first matching frame of their stack; waits (the event
loop's select, idle pool threads) are left out. Prints, per stage, the share of the
event loop thread's busy samples and its milliseconds per chunk, then the same for the
other threads together (the database threads: each request's admission and ledger).
With --gil, only samples of the thread holding the GIL count (a thread waiting for it, as
after each SQLite call or socket write, would otherwise look busy where it waits). With
--raw, py-spy's stacks are kept there (one line per stack and its count) for a
closer look than by stage.

`--server llama-server` profiles chatsite in front of llama.cpp's own server instead
(bench.llama_server.LlamaServer, the packaged GGUF, #37): real tokens at the speed of the
fastest server for this model on a CPU, sharing the cores with chatsite as it would on a
small box. An answer may end before --chunks (the model's end of text): chunks are
counted as the client receives them.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.llama_server import LlamaServer
from bench.upstream_cost import MODEL, burst, start_lockstep_server
from tests.support.livesite import ROOT, LiveSite, unlimited_api_key

RESULTS = ROOT / "bench" / "results" / "upstream_profile.json"
RATE = 200  # samples a second
# The stages of a streamed chunk, each named by a frame only its stack holds; first match wins.
STAGES = (
    ("write to the client (daphne, Twisted)", ("guarded_send", "callWithLogger")),
    ("format the client's chunks (store read, JSON)", ("streaming_content.<locals>.awrapper",)),
    ("read the model server (aiohttp, SSE parse)", ("UpstreamPool._stream", "_SelectorSocketTransport._read_ready")),
    ("append to the stream store, wake readers", ("UpstreamPool._flush", "InMemoryStreamStore._wake")),
    ("the door (request, key, admission, ledger)", ("run_get_response", "RequestLog.__call__", "generation/")),
)
IDLE = ("select (", "epoll", "wait (threading", "_worker (concurrent/futures/thread.py:81)", "_housekeep_inline")


def stage_of(frames: list[str]) -> str | None:
    """The stage a sample's stack belongs to; None for a thread waiting."""
    if any(idle in frames[-1] for idle in IDLE):
        return None
    for name, marks in STAGES:
        if any(mark in frame for frame in frames for mark in marks):
            return name
    return "other"


def summarize(raw: Path, chunks: int) -> dict[str, dict[str, float]]:
    """{thread group: {stage: samples}} from py-spy's raw (collapsed) output."""
    groups: dict[str, collections.Counter[str]] = {
        "event loop thread": collections.Counter(),
        "other threads": collections.Counter(),
    }
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if (stage := stage_of(frames)) is not None:
            group = "event loop thread" if "MainThread" in frames[0] else "other threads"
            groups[group][stage] += int(count)
    return {
        group: {stage: 1000 * samples / RATE / chunks for stage, samples in counts.most_common()}
        for group, counts in groups.items()
    }


def llama_server_env(stack: contextlib.ExitStack, level: int) -> dict[str, str]:
    """llama-server started (stopped with `stack`), and the CHAT_UPSTREAMS of a chatsite in front of it."""
    server = stack.enter_context(LlamaServer(parallel=max(8, level)))
    upstream = {"model": MODEL, "base_url": server.base_url, "upstream_model": server.model, "max_concurrent": 64}
    return {"CHAT_UPSTREAMS": json.dumps([upstream])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", choices=("lockstep", "llama-server"), default="lockstep")
    parser.add_argument("--level", type=int, default=8)
    parser.add_argument("--chunks", type=int, default=64)
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--py-spy", default=shutil.which("py-spy"), help="the py-spy executable")
    parser.add_argument("--gil", action="store_true", help="only the thread holding the GIL")
    parser.add_argument("--raw", type=Path, help="keep py-spy's raw stacks in this file")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    if not args.py_spy:
        sys.exit("py-spy not found: pip install py-spy, or give --py-spy")

    with contextlib.ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chatsite-upstream-profile-")))
        raw = scratch / "profile.txt"
        if args.server == "llama-server":
            env = llama_server_env(stack, args.level)
        else:
            _, _, _, env = start_lockstep_server(stack, scratch, args.chunks, 0.02)
        site = stack.enter_context(LiveSite(env=env))
        assert site.process is not None
        key = unlimited_api_key(site)
        asyncio.run(burst(site.base_url, key, MODEL, args.level, args.chunks))  # warm-up
        record = [args.py_spy, "record", "--pid", str(site.process.pid), "-d", str(args.seconds), "-r", str(RATE)]
        spy = subprocess.Popen(
            [*record, "--threads", "--idle", *(["--gil"] if args.gil else []), "-f", "raw", "-o", str(raw)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        bursts, chunks, stop_at = 0, 0, time.monotonic() + args.seconds - 2  # all within the recording
        while time.monotonic() < stop_at:
            received = asyncio.run(burst(site.base_url, key, MODEL, args.level, args.chunks))
            bursts += 1
            chunks += len(received["ttfts"]) + len(received["gaps"])
        spy.wait()
        groups = summarize(raw, chunks)
        if args.raw:
            args.raw.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(raw, args.raw)

    print(f"{bursts} bursts of {args.level} streams, {chunks} chunks; ms per chunk by stage:")
    for group, stages in groups.items():
        busy = sum(stages.values())
        print(f"  {group}: {busy:.3f} ms per chunk")
        for stage, ms in stages.items():
            print(f"    {ms:6.3f} ms  {100 * ms / busy:4.1f} %  {stage}")
    result = {
        "command": shlex.join(["python", "-m", "bench.upstream_profile", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpu_count": os.cpu_count(),
        "loadavg_end": os.getloadavg(),
        "settings": {
            "server": args.server,
            "level": args.level,
            "chunks": args.chunks,
            "seconds": args.seconds,
            "gil": args.gil,
            "bursts": bursts,
            "chunks_received": chunks,
        },
        "ms_per_chunk": {
            group: {stage: round(ms, 4) for stage, ms in stages.items()} for group, stages in groups.items()
        },
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results written to {args.results}")


if __name__ == "__main__":
    main()
