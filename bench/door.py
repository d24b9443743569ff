"""How fast requests get through the door: probes, tiny completions, a burst of streams.

    python -m bench.door [--before REV] [--rounds N] [--seconds 5] [--clients 32] [--burst 256]
        [--ledger-windows N]

Starts chatsite under daphne (its own SQLite database, the synthetic model) and measures,
against that one process:

1. `/healthz` requests/s: --clients clients, each on a kept-alive connection, for --seconds;
2. tiny completions requests/s: non-streaming chat completions with `max_tokens: 1`, the
   same clients and time, each by API key;
3. a burst of --burst streaming chat completions sent at once, each on a connection of its
   own: time to the first content chunk, p50 and p95, and failed requests;
4. with --ledger-windows N, N more windows of tiny completions back to back: whether a
   request costs more as the user's records of the day pile up.

With --before REV, the same are measured first on REV (its tracked files exported
to a scratch folder, served by this virtual environment), then on this working tree, in
one run: the shared machine's load falls on both alike, so compare the two. With
--rounds N, each side is measured N times, the order swapped every round, and each
figure is the median of its rounds (each round's figures are kept too). Writes
bench/results/door.json; docs/benchmarks.md explains it. Goals (issue #18): /healthz >=
400/s; tiny completions >= 150/s and >= 0.6 x /healthz; the burst's TTFT p50 <= 1.5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.fanout import process_cpu_s
from tests.support.livesite import ROOT, LiveSite, unlimited_api_key
from tests.support.raw_http import ChunkedDecoder

RESULTS = ROOT / "bench" / "results" / "door.json"
HOST = "127.0.0.1"
SITE_ENV = {
    "CHAT_ENABLE_SYNTHETIC": "1",
    "CHAT_MODEL": "synthetic",
    # The model is not what is measured: a whole burst generates at once, and waits nowhere.
    "GENERATION_MAX_CONCURRENT": "256",
    "GENERATION_MAX_QUEUE": "1024",
    # One user opens every stream of a burst: no per-user limit in the way of the figure.
    "CHAT_MAX_STREAMS_PER_USER": "10000",
    "REDIS_URL": "",
}
BURST_TOKENS = 16
GOALS = {"healthz_per_s": 400.0, "tiny_per_s": 150.0, "tiny_to_healthz": 0.6, "burst_ttft_p50_s": 1.5}


class Connection:
    """One kept-alive HTTP/1.1 connection that sends a request and reads its whole response."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        return cls(*await asyncio.open_connection(HOST, port))

    async def exchange(self, request: bytes) -> int:
        self.writer.write(request)
        status, headers = await _response_head(self.reader)
        if "content-length" in headers:
            await self.reader.readexactly(int(headers["content-length"]))
        else:  # chunked: daphne's way when the response names no length
            decoder = ChunkedDecoder()
            while not decoder.finished:
                data = await self.reader.read(65536)
                if not data:
                    raise ConnectionResetError("the server closed the connection mid-response")
                decoder.feed(data)
        return status

    def close(self) -> None:
        self.writer.close()


async def _response_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split(" ", 2)[1]), headers


def request_bytes(port: int, method: str, path: str, key: str | None = None, body: Any = None) -> bytes:
    payload = json.dumps(body).encode() if body is not None else b""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {HOST}:{port}"]
    if key:
        lines.append(f"Authorization: Bearer {key}")
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


def chat_body(*, max_tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": "synthetic",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


async def closed_loop(port: int, request: bytes, *, clients: int, seconds: float, pid: int) -> dict[str, Any]:
    """`clients` connections send `request` back to back for `seconds`: requests/s, statuses,
    and the server's CPU time per request (`pid`'s), which the machine's load skews less."""
    statuses: dict[str, int] = {}
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        connection = await Connection.open(port)
        try:
            while time.perf_counter() < deadline:
                status = await connection.exchange(request)
                statuses[str(status)] = statuses.get(str(status), 0) + 1
        finally:
            connection.close()

    started, cpu_before = time.perf_counter(), process_cpu_s(pid)
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed, cpu = time.perf_counter() - started, process_cpu_s(pid) - cpu_before
    served = sum(statuses.values())
    return {
        "requests_per_s": round(served / elapsed, 1),
        "server_cpu_ms_per_request": round(1000 * cpu / max(1, served), 2),
        "statuses": statuses,
    }


async def first_token_s(port: int, request: bytes, start: asyncio.Event) -> float:
    """Send one streaming request when `start` fires, on a connection of its own; the
    seconds to its first content chunk. The stream is read to its end."""
    await start.wait()
    sent = time.perf_counter()
    reader, writer = await asyncio.open_connection(HOST, port)
    first: float | None = None
    try:
        writer.write(request)
        status, _ = await _response_head(reader)
        if status != 200:
            raise RuntimeError(f"status {status}")
        decoder, body = ChunkedDecoder(), b""
        while not decoder.finished:
            data = await reader.read(65536)
            if not data:
                break
            body += decoder.feed(data)
            if first is None and b'"content":"' in body.replace(b'"content":""', b""):
                first = time.perf_counter() - sent
        if not body.rstrip().endswith(b"data: [DONE]") or first is None:
            raise RuntimeError("the stream ended before [DONE]")
        return first
    finally:
        writer.close()


async def burst(port: int, key: str, size: int, pid: int) -> dict[str, Any]:
    request = request_bytes(port, "POST", "/v1/chat/completions", key, chat_body(max_tokens=BURST_TOKENS, stream=True))
    start = asyncio.Event()
    tasks = [asyncio.create_task(first_token_s(port, request, start)) for _ in range(size)]
    await asyncio.sleep(0.2)  # every client waits at the start line
    cpu_before = process_cpu_s(pid)
    start.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    cpu = process_cpu_s(pid) - cpu_before
    ttfts = sorted(result for result in results if isinstance(result, float))
    errors: dict[str, int] = {}
    for result in results:
        if isinstance(result, BaseException):
            errors[repr(result)[:120]] = errors.get(repr(result)[:120], 0) + 1
    return {
        "streams": size,
        "ttft_p50_s": round(statistics.median(ttfts), 3) if ttfts else None,
        "ttft_p95_s": round(ttfts[int(0.95 * (len(ttfts) - 1))], 3) if ttfts else None,
        "failed": size - len(ttfts),
        "server_cpu_ms_per_stream": round(1000 * cpu / size, 2),
        "errors": errors,
    }


async def measure_site(site: LiveSite, key: str, args: argparse.Namespace) -> dict[str, Any]:
    port = site.port
    assert site.process is not None
    pid = site.process.pid
    healthz = request_bytes(port, "GET", "/healthz")
    tiny = request_bytes(port, "POST", "/v1/chat/completions", key, chat_body(max_tokens=1, stream=False))
    # Warm-up: first requests import, compile and connect what later ones reuse.
    await closed_loop(port, tiny, clients=4, seconds=1, pid=pid)
    figures = {
        "healthz": await closed_loop(port, healthz, clients=args.clients, seconds=args.seconds, pid=pid),
        "tiny_completions": await closed_loop(port, tiny, clients=args.clients, seconds=args.seconds, pid=pid),
    }
    await asyncio.sleep(1)
    figures["burst"] = await burst(port, key, args.burst, pid)
    if args.ledger_windows:
        # Back-to-back windows of the tiny load: whether a request costs more as the
        # user's records of the day pile up (the admission sums them).
        figures["tiny_as_the_ledger_grows"] = [
            await closed_loop(port, tiny, clients=args.clients, seconds=args.seconds, pid=pid)
            for _ in range(args.ledger_windows)
        ]
    return figures


def measure(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    with LiveSite(env=SITE_ENV, root=root) as site:
        key = unlimited_api_key(site)
        load_before = os.getloadavg()[0]
        figures = asyncio.run(measure_site(site, key, args))
        figures["load_average_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
        return figures


def export(revision: str, into: Path) -> Path:
    """The tracked files of `revision`, without a worktree: nothing is written to the repository."""
    archive = subprocess.run(["git", "archive", revision], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def goals_met(figures: dict[str, Any]) -> dict[str, bool]:
    healthz = figures["healthz"]["requests_per_s"]
    tiny = figures["tiny_completions"]["requests_per_s"]
    p50 = figures["burst"]["ttft_p50_s"]
    return {
        "healthz_per_s": healthz >= GOALS["healthz_per_s"],
        "tiny_per_s": tiny >= GOALS["tiny_per_s"],
        "tiny_to_healthz": tiny >= GOALS["tiny_to_healthz"] * healthz,
        "burst_ttft_p50_s": p50 is not None and p50 <= GOALS["burst_ttft_p50_s"],
        "burst_no_failures": figures["burst"]["failed"] == 0,
    }


def median_run(measured: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the rounds; failures, statuses and errors are summed."""

    def merged(key: str, values: list[Any]) -> Any:
        if isinstance(values[0], dict):
            if key in ("statuses", "errors"):  # counts
                return {name: sum(v.get(name, 0) for v in values) for name in {n for v in values for n in v}}
            return {name: merged(name, [v[name] for v in values]) for name in values[0]}
        if key == "failed":
            return sum(values)
        if isinstance(values[0], (int, float)):
            return round(statistics.median(values), 3)
        return values  # the load averages, round by round

    if len(measured) == 1:
        return dict(measured[0])
    return {key: merged(key, [run[key] for run in measured]) for key in measured[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="a revision to measure first, in the same run")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--burst", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=1, help="rounds on each side, the order swapped every round")
    parser.add_argument(
        "--ledger-windows", type=int, default=0, help="then N more windows of tiny completions, back to back"
    )
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        roots = {"after": ROOT}
        if args.before:
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chatsite-door-")))
            roots = {"before": export(args.before, scratch), **roots}
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in roots}
        for number in range(args.rounds):
            # The order swaps every round: a drift of the shared machine falls on both alike.
            for name in list(roots)[:: 1 if number % 2 == 0 else -1]:
                rounds[name].append(measure(roots[name], args))
    revisions = {"after": "working tree"}
    if args.before:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", args.before], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout.strip()
        revisions["before"] = f"{args.before} ({commit})"
    runs = {
        name: {"revision": revisions[name], **median_run(measured), "rounds": measured}
        for name, measured in sorted(rounds.items(), reverse=True)  # before, then after
    }
    for run in runs.values():
        run["goals_met"] = goals_met(run)
    payload = {
        "command": "python -m bench.door " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "cpu_count": os.cpu_count(),
        "goals": GOALS,
        "runs": runs,
    }
    args.results.parent.mkdir(exist_ok=True)
    args.results.write_text(json.dumps(payload, indent=2) + "\n")
    for name, run in runs.items():
        print(
            f"{name:<7} healthz {run['healthz']['requests_per_s']:>7}/s "
            f"({run['healthz']['server_cpu_ms_per_request']} ms CPU)  "
            f"tiny {run['tiny_completions']['requests_per_s']:>7}/s "
            f"({run['tiny_completions']['server_cpu_ms_per_request']} ms CPU)  "
            f"burst TTFT p50 {run['burst']['ttft_p50_s']} s p95 {run['burst']['ttft_p95_s']} s "
            f"failed {run['burst']['failed']}  load {run['load_average_1m']}"
        )


if __name__ == "__main__":
    main()
