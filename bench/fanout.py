"""SSE fan-out: many concurrent chat streams against a bare Channels consumer.

    .venv/bin/python -m bench.fanout [--clients 1000] [--streams 50] [--rate 20] [--tokens 300]

One run, same machine, two phases one after the other:

1. Baseline: bench/bare_sse.py under daphne, a consumer that only sends `--tokens`
   SSE events at `--rate` per second. `--clients` concurrent clients. Measures the
   delivered events/s in aggregate (events ÷ first connect → last event), p50/p99 of
   the gaps between consecutive events of a stream, and daphne's peak RSS (VmHWM).
2. chatsite: a LiveSite with the synthetic model at `--rate` words/s. One user,
   `--streams` conversations with max_tokens=`--tokens`; each gets a prompt posted the
   way the HTMX form does, then `--clients` readers, spread evenly over those streams
   (fan-out: several readers per generation, as tabs, devices and API resumers are),
   read their `sse-connect` stream to its `done` event. Measures delivered tokens/s
   (words that arrived live in all readers' deltas ÷ first reader's first event → last
   `done`), events/s, gaps, peak RSS, and checks that each reader got all its text in
   order: exactly `--tokens` words, the synthetic model's words in order, strictly
   increasing `id:`s, and the saved Message is `complete` with that same text.

Targets: every chatsite stream complete and in order; chatsite peak RSS ≤ 600 MB;
chatsite tokens/s ≥ 0.8 x bare events/s (one synthetic token would be one event if
nothing were coalesced). Writes bench/results/fanout.json.

The client is plain asyncio streams with hand-written HTTP/1.1 and SSE parsing on
raw bytes: on 2 cores it shares the CPU with the server, so it must stay cheap.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from inference.generators import SYNTHETIC_TEXT
from tests.support.livesite import ROOT, ChatClient, LiveSite, daphne_endpoint, free_port, stop_process
from tests.support.raw_http import (
    HOST,
    Counters,
    Response,
    http_request,
    memory,
    parse_block,
    read_events,
)

RESULTS = Path(__file__).parent / "results" / "fanout.json"
PROMPT = "Tell me how streaming answers work."
RSS_TARGET_MB = 600.0
THROUGHPUT_TARGET = 0.8

_children: list[subprocess.Popen[bytes]] = []


@dataclass
class StreamResult:
    """What one client saw of one SSE stream; filled in as events arrive."""

    stream_id: str = ""
    opened_at: float | None = None  # request sent (bare) or prompt posted (chatsite)
    first_at: float | None = None
    last_at: float | None = None
    events: int = 0
    last_id: int = 0
    in_order: bool = True
    done: bool = False
    ended: bool = False  # the body ended (bare) or the `done` event came (chatsite)
    pieces: list[str] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    marks: list[tuple[float, int]] = field(default_factory=list)  # (arrival, tokens carried) per event
    setup_s: float | None = None  # POST (chatsite) or connect + response head (bare)
    error: str | None = None

    def saw_event(self, now: float, seq: int | None, tokens: int = 1) -> None:
        self.marks.append((now, tokens))
        if self.last_at is None:
            self.first_at = now
        else:
            self.gaps.append(now - self.last_at)
        self.last_at = now
        self.events += 1
        if seq is not None:
            if seq <= self.last_id:
                self.in_order = False
            self.last_id = seq

    @property
    def text(self) -> str:
        return "".join(self.pieces)


async def run_all(tasks: Iterable[Awaitable[None]], timeout: float) -> int:
    """Run the client tasks; cancel what is left after `timeout` so the bench always ends.

    Returns how many were cancelled.
    """
    running = [asyncio.ensure_future(task) for task in tasks]
    _, pending = await asyncio.wait(running, timeout=timeout)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return len(pending)


# --- phase 1: the bare consumer ------------------------------------------------------


async def bare_clients(port: int, args: argparse.Namespace, counters: Counters) -> tuple[list[StreamResult], float]:
    """Open all streams (`--ramp-concurrency` handshakes at a time) and read them to the end."""
    path = "/sse/?" + urlencode({"n": args.tokens, "interval": 1 / args.rate})
    results = [StreamResult() for _ in range(args.clients)]
    opening = asyncio.Semaphore(args.ramp_concurrency)

    async def client(result: StreamResult) -> None:
        def on_blocks(now: float, blocks: list[bytes]) -> bool:
            for block in blocks:
                _, seq, data = parse_block(block)
                if data:
                    result.saw_event(now, seq)
            return False

        try:
            async with opening:
                result.opened_at = time.perf_counter()
                response = await http_request(port, "GET", path, counters, {"Accept": "text/event-stream"})
                result.setup_s = time.perf_counter() - result.opened_at
            if response.status != 200:
                result.error = f"HTTP {response.status}"
                response.close()
                return
            await read_events(response, on_blocks)
            result.ended = True
            result.done = result.events == args.tokens and result.in_order
        except Exception as error:
            result.error = f"{type(error).__name__}: {error}"

    first_connect = time.perf_counter()
    counters.timed_out = await run_all((client(result) for result in results), args.timeout)
    return results, first_connect


def run_bare(args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="fanout-bare-", suffix=".log", delete=False)  # noqa: SIM115
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    process = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-e", daphne_endpoint(HOST, port), "bench.bare_sse:application"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    _children.append(process)
    try:
        wait_listening(process, port, Path(log.name))
        counters = Counters()
        load = os.getloadavg()  # others' work on this machine skews every figure
        cpu_before = process_cpu_s(process.pid)
        bench_cpu_before = time.process_time()
        results, started = asyncio.run(bare_clients(port, args, counters))
        figures = summarize(results, started, counters, args.clients * args.rate)
        figures["server_cpu_s"] = process_cpu_s(process.pid) - cpu_before
        figures["bench_cpu_s"] = time.process_time() - bench_cpu_before
        figures.update(memory(process.pid))
        figures["complete"] = sum(r.done for r in results)
        figures["loadavg_before"] = load
        return figures
    finally:
        stop_process(process)
        Path(log.name).unlink(missing_ok=True)


def wait_listening(process: subprocess.Popen[bytes], port: int, log: Path, timeout: float = 60) -> None:
    async def probe() -> bool:
        try:
            response = await http_request(port, "GET", "/sse/?n=0", Counters())
            await response.body()
            return response.status == 200
        except OSError:
            return False

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"bare daphne exited with {process.returncode}:\n{log.read_text(errors='replace')}")
        if asyncio.run(probe()):
            return
        time.sleep(0.1)
    raise TimeoutError(f"bare daphne not answering after {timeout} s:\n{log.read_text(errors='replace')}")


# --- phase 2: chatsite ---------------------------------------------------------------

STREAM_URL = re.compile(rb'sse-connect="([^"]+)"')


async def chat_clients(
    port: int, conversation_ids: list[str], cookies: dict[str, str], args: argparse.Namespace, counters: Counters
) -> list[StreamResult]:
    """Post a prompt to each conversation (`--ramp-concurrency` at a time), then have
    `--clients` readers, spread evenly over those streams, read them to `done`."""
    results = [StreamResult() for _ in range(args.clients)]
    posting = asyncio.Semaphore(args.ramp_concurrency)
    cookie = cookie_header(cookies)

    async def start(conversation_id: str) -> str:
        async with posting:
            return await post_prompt(port, conversation_id, cookies, counters)

    async def client(stream_url: str, result: StreamResult) -> None:
        try:
            result.opened_at = time.perf_counter()
            stream = await open_chat_stream(port, stream_url, cookie, result, counters)
            result.setup_s = time.perf_counter() - result.opened_at
            if stream is not None:
                await read_chat_stream(stream, result)
        except Exception as error:
            result.error = f"{type(error).__name__}: {error}"

    stream_urls = await asyncio.gather(*(start(conversation_id) for conversation_id in conversation_ids))
    counters.timed_out = await run_all(
        (client(stream_urls[n % len(stream_urls)], result) for n, result in enumerate(results)), args.timeout
    )
    return results


def cookie_header(cookies: dict[str, str]) -> str:
    return "; ".join(f"{name}={value}" for name, value in cookies.items())


async def post_prompt(port: int, conversation_id: str, cookies: dict[str, str], counters: Counters) -> str:
    """Send PROMPT to a conversation the way the HTMX form does; returns the answer's stream URL."""
    headers = {
        "Cookie": cookie_header(cookies),
        "HX-Request": "true",
        "X-CSRFToken": cookies["csrftoken"],
        "Content-Type": "application/x-www-form-urlencoded",
    }
    form = urlencode({"prompt": PROMPT}).encode()
    response = await http_request(port, "POST", f"/chat/{conversation_id}/", counters, headers, form)
    html = await response.body()
    found = STREAM_URL.search(html)
    if response.status != 200 or not found:
        raise RuntimeError(f"POST answered {response.status}: {html[:200]!r}")
    return found.group(1).decode()


async def open_chat_stream(
    port: int, stream_url: str, cookie: str, result: StreamResult, counters: Counters
) -> Response | None:
    """GET an answer's SSE stream up to its response head; None (and `result.error`) if refused."""
    result.stream_id = stream_url.rstrip("/").rsplit("/", 1)[-1]
    stream = await http_request(port, "GET", stream_url, counters, {"Cookie": cookie, "Accept": "text/event-stream"})
    if stream.status != 200:
        result.error = f"stream answered {stream.status}"
        stream.close()
        return None
    return stream


async def read_chat_stream(stream: Response, result: StreamResult) -> None:
    """Read an answer's token events into `result` until its `done` event."""

    def on_blocks(now: float, blocks: list[bytes]) -> bool:
        for block in blocks:
            kind, seq, data = parse_block(block)
            if not data:
                continue  # a heartbeat comment
            if kind == b"token":
                delta = json.loads(data[0])["delta"]
                result.pieces.append(delta)
                result.saw_event(now, seq, len(delta.split()))
            elif kind == b"done":
                result.saw_event(now, seq, 0)
                result.ended = True
                return True
            else:
                result.error = f"unexpected event {kind!r}: {b' '.join(data)[:200]!r}"
                return True
        return False

    await read_events(stream, on_blocks)


def run_chatsite(args: argparse.Namespace) -> dict[str, Any]:
    env = {
        "CHAT_ENABLE_SYNTHETIC": "1",
        "CHAT_MODEL": "synthetic",
        "CHAT_SYNTHETIC_TOKENS_PER_S": str(args.rate),
        "GENERATION_MAX_CONCURRENT": str(args.streams + 24),
        "GENERATION_MAX_QUEUE": str(args.streams * 2),
        # One user holds every stream and reader: no per-user limit in the way of the figure.
        "CHAT_MAX_STREAMS_PER_USER": "100000",
    }
    with LiveSite(env=env) as site:
        assert site.process is not None
        _children.append(site.process)
        use_site_settings(site.env, ("DATABASE_URL", "DJANGO_SECRET_KEY", *env))
        from django.contrib.auth import get_user_model
        from django.db import connections

        from generation.models import Conversation

        client = ChatClient(site.base_url)
        client.signup("fanout")
        cookies = {name: client.http.cookies[name] for name in ("sessionid", "csrftoken")}
        user = get_user_model().objects.get(username="fanout")
        lift_limits(user, readers=args.clients, tokens=args.tokens)
        conversations = Conversation.objects.bulk_create(
            Conversation(user=user, model="synthetic", max_tokens=args.tokens) for _ in range(args.streams)
        )
        connections.close_all()  # no open SQLite connection in this process while the site writes

        counters = Counters()
        load = os.getloadavg()
        cpu_before = process_cpu_s(site.process.pid)
        bench_cpu_before = time.process_time()
        results = asyncio.run(chat_clients(site.port, [str(c.id) for c in conversations], cookies, args, counters))
        server_cpu_s = process_cpu_s(site.process.pid) - cpu_before
        bench_cpu_s = time.process_time() - bench_cpu_before
        rss = memory(site.process.pid)
        saved = saved_answers(results)
        connections.close_all()
        errors_logged = site.log().count("Traceback")

    figures = chat_figures(results, saved, args.tokens, counters, args.clients * args.rate)
    figures.update(
        server_cpu_s=server_cpu_s,
        bench_cpu_s=bench_cpu_s,
        server_log_tracebacks=errors_logged,
        loadavg_before=load,
        **rss,
    )
    return figures


def use_site_settings(site_env: dict[str, str], names: Iterable[str]) -> None:
    """Set Django up in this process with a live site's settings `names`.

    The bench process reads and writes the live site's database directly, with the same
    settings, to create conversations and check what was saved.
    """
    for name in names:
        os.environ[name] = site_env[name]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    import django

    django.setup()


def saved_answers(results: list[StreamResult]) -> dict[str, dict[str, Any]]:
    """The saved answer of each stream read, by stream id (Django set up; see use_site_settings)."""
    from generation.models import Message

    stream_ids = [r.stream_id for r in results if r.stream_id]
    rows = Message.objects.filter(stream_id__in=stream_ids).values(
        "stream_id", "content", "status", "completion_tokens"
    )
    return {row["stream_id"]: row for row in rows}


def chat_figures(
    results: list[StreamResult],
    saved: dict[str, dict[str, Any]],
    tokens: int,
    counters: Counters,
    ideal_events_per_s: float,
) -> dict[str, Any]:
    """Check each chatsite stream (sets `done`) and sum the streams up.

    A stream is done when it ended with `done`, its ids rose, its text is the synthetic
    model's first `tokens` words, and its saved answer is complete with that same text.
    """
    expected = " ".join(itertools.islice(itertools.cycle(SYNTHETIC_TEXT.split()), tokens))
    checks = {"ended_with_done": 0, "words_exact": 0, "text_expected": 0, "ids_increasing": 0, "saved_complete": 0}
    for result in results:
        text = result.text
        row = saved.get(result.stream_id)
        checks["ended_with_done"] += result.ended
        checks["words_exact"] += len(text.split()) == tokens
        checks["text_expected"] += text == expected
        checks["ids_increasing"] += result.in_order and result.events > 0
        checks["saved_complete"] += row is not None and row["status"] == "complete" and row["content"] == text
        result.done = (
            result.ended
            and result.in_order
            and text == expected
            and row is not None
            and row["status"] == "complete"
            and row["content"] == text
        )
    starts = [r.first_at for r in results if r.first_at is not None]
    figures = summarize(results, min(starts) if starts else time.perf_counter(), counters, ideal_events_per_s)
    words = sum(len(r.text.split()) for r in results)
    figures["tokens"] = words
    # A reader that connects after its stream began gets the backlog in its first event
    # at once: count only the words that came live, after each reader's first event.
    live_words = sum(len(r.text.split()) - len(r.pieces[0].split()) for r in results if r.pieces)
    figures["tokens_per_s"] = live_words / figures["wall_s"] if figures["wall_s"] else 0.0
    # Every ended stream's last event is its `done`; the rest carry the tokens.
    ended = [r for r in results if r.ended]
    figures["tokens_per_event"] = sum(len(r.text.split()) for r in ended) / max(1, sum(r.events - 1 for r in ended))
    # The first event also carries what was generated before the stream was opened:
    # count the words after it, over the time after it.
    per_stream = [
        (len(r.text.split()) - len(r.pieces[0].split())) / (r.last_at - r.first_at)
        for r in results
        if r.ended and r.pieces and r.first_at is not None and r.last_at is not None and r.last_at > r.first_at
    ]
    figures["per_stream_tokens_per_s_median"] = statistics.median(per_stream) if per_stream else 0.0
    figures.update(checks=checks, complete=sum(r.done for r in results))
    return figures


def lift_limits(user: Any, *, readers: int, tokens: int) -> None:
    """Let the one bench user run every stream at once: the plan's limits are per user."""
    from accounts.services import account_for

    account = account_for(user)
    account.requests_per_minute = readers * 10
    account.max_concurrent_streams = readers * 2
    account.max_tokens_per_request = max(tokens, 1024)
    account.tokens_per_day = 2_000_000_000
    account.save()


# --- figures -------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(
    results: list[StreamResult], started: float, counters: Counters, ideal_events_per_s: float
) -> dict[str, Any]:
    """Aggregate figures over streams; `started` is when the wall-clock window opens."""
    lasts = [r.last_at for r in results if r.last_at is not None]
    wall = (max(lasts) - started) if lasts else 0.0
    events = sum(r.events for r in results)
    gaps = [gap for r in results for gap in r.gaps]
    setups = [r.setup_s for r in results if r.setup_s is not None]
    firsts = [r.first_at for r in results if r.first_at is not None]
    errors = [r.error for r in results if r.error]
    # Steady state: from the moment every reader is receiving until the first one ends,
    # so that connection set-up (ramp) and wind-down don't dilute the delivery rate.
    steady_from, steady_to = (max(firsts), min(lasts)) if firsts and lasts else (0.0, 0.0)
    steady_tokens = sum(n for r in results for at, n in r.marks if steady_from <= at <= steady_to)
    steady_events = sum(1 for r in results for at, n in r.marks if steady_from <= at <= steady_to and n)
    steady_s = steady_to - steady_from
    return {
        "streams": len(results),
        "steady_s": steady_s,
        "steady_tokens_per_s": steady_tokens / steady_s if steady_s > 0 else None,
        "steady_events_per_s": steady_events / steady_s if steady_s > 0 else None,
        "events": events,
        "wall_s": wall,
        "events_per_s": events / wall if wall else 0.0,
        "ideal_events_per_s": ideal_events_per_s,
        "gap_p50_ms": percentile(gaps, 0.50) * 1000,
        "gap_p99_ms": percentile(gaps, 0.99) * 1000,
        "gap_max_ms": max(gaps, default=float("nan")) * 1000,
        "ramp_s": (max(firsts) - started) if firsts else None,  # until the last stream's first event
        "peak_concurrent_streams": peak_overlap(
            (r.first_at, r.last_at) for r in results if r.first_at is not None and r.last_at is not None
        ),
        "setup_p50_ms": percentile(setups, 0.50) * 1000,
        "setup_max_ms": max(setups, default=float("nan")) * 1000,
        "connect_retries": counters.retries,
        "timed_out_streams": counters.timed_out,
        "connect_retry_errors": counters.retry_errors,
        "errors": len(errors),
        "first_errors": errors[:5],
    }


def peak_overlap(spans: Iterable[tuple[float, float]]) -> int:
    """The most streams that were delivering events at the same moment."""
    edges = sorted(edge for start, end in spans for edge in ((start, 1), (end, -1)))
    return max(itertools.accumulate(step for _, step in edges), default=0)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_watchdog(
    seconds: float, processes: list[subprocess.Popen[bytes]] = _children, name: str = "bench.fanout"
) -> None:
    """Whatever hangs (a server start, a stuck phase), the run ends and takes `processes` down.

    `processes` is read when the time is up: servers started later can be appended to it.
    """

    def fire() -> None:
        print(f"{name}: still running after {seconds:.0f} s, giving up", file=sys.stderr, flush=True)
        for process in processes:
            if process.poll() is None:
                process.kill()
        os._exit(3)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()


def raise_open_files(clients: int) -> None:
    # Each client holds a socket (a POST's and a stream's, briefly, in chatsite).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = clients * 3 + 1024
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (wanted if hard == resource.RLIM_INFINITY else min(hard, wanted), hard)
        )


def print_table(bare: dict[str, Any], chat: dict[str, Any], targets: dict[str, bool], args: argparse.Namespace) -> None:
    def number(value: Any, digits: int = 1) -> str:
        return "-" if value is None else f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"

    rows = [
        ("streams complete (all text, in order)", f"{bare['complete']}/{bare['streams']}",
         f"{chat['complete']}/{chat['streams']}", "all"),
        ("steady state: s (all readers on, none done)", number(bare["steady_s"], 2), number(chat["steady_s"], 2), ""),
        ("steady state: tokens/s delivered", number(bare["steady_tokens_per_s"]), number(chat["steady_tokens_per_s"]),
         f">= {number(THROUGHPUT_TARGET * (bare['steady_events_per_s'] or 0))}"),
        ("steady state: SSE events/s", number(bare["steady_events_per_s"]), number(chat["steady_events_per_s"]), ""),
        ("whole window: tokens/s delivered (live)", "-", number(chat["tokens_per_s"]), ""),
        ("SSE events/s delivered", number(bare["events_per_s"]), number(chat["events_per_s"]), ""),
        ("ideal events/s (clients x rate)", number(bare["ideal_events_per_s"]), number(chat["ideal_events_per_s"]), ""),
        ("wall s (window of the rate figures)", number(bare["wall_s"], 2), number(chat["wall_s"], 2), ""),
        ("ramp s (until last stream's 1st event)", number(bare["ramp_s"], 2), number(chat["ramp_s"], 2), ""),
        ("peak concurrent streams", number(bare["peak_concurrent_streams"]), number(chat["peak_concurrent_streams"]),
         ""),
        ("per-stream tokens/s (median)", "-", number(chat["per_stream_tokens_per_s_median"]), f"rate {args.rate:g}"),
        ("tokens per token event", "-", number(chat["tokens_per_event"], 2), ""),
        ("gap p50 ms", number(bare["gap_p50_ms"]), number(chat["gap_p50_ms"]), ""),
        ("gap p99 ms", number(bare["gap_p99_ms"]), number(chat["gap_p99_ms"]), ""),
        ("gap max ms", number(bare["gap_max_ms"]), number(chat["gap_max_ms"]), ""),
        ("connect / POST p50 ms", number(bare["setup_p50_ms"]), number(chat["setup_p50_ms"]), ""),
        ("connect / POST max ms", number(bare["setup_max_ms"]), number(chat["setup_max_ms"]), ""),
        ("connect retries", number(bare["connect_retries"]), number(chat["connect_retries"]), ""),
        ("client errors", number(bare["errors"]), number(chat["errors"]), ""),
        ("streams cut by --timeout", number(bare["timed_out_streams"]), number(chat["timed_out_streams"]), ""),
        ("server peak RSS MB (VmHWM)", number(bare["peak_rss_mb"]), number(chat["peak_rss_mb"]),
         f"<= {RSS_TARGET_MB:.0f}"),
        ("server threads at end", number(bare["threads"]), number(chat["threads"]), ""),
        ("server CPU s during phase", number(bare["server_cpu_s"]), number(chat["server_cpu_s"]), ""),
        ("bench client CPU s during phase", number(bare["bench_cpu_s"]), number(chat["bench_cpu_s"]), ""),
    ]  # fmt: skip
    print(f"{'figure':<42}{'bare consumer':>16}{'chatsite':>16}{'target':>14}")
    for name, left, right, target in rows:
        print(f"{name:<42}{left:>16}{right:>16}{target:>14}")
    print(f"chatsite checks: {chat['checks']}")
    for name, met in targets.items():
        print(f"target {name}: {'met' if met else 'MISSED'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=1000, help="concurrent SSE readers")
    parser.add_argument("--streams", type=int, default=50, help="generations the readers share (fan-out)")
    parser.add_argument("--rate", type=float, default=20.0, help="tokens (events) per second per stream")
    parser.add_argument("--tokens", type=int, default=600, help="tokens (events) per stream")
    parser.add_argument("--ramp-concurrency", type=int, default=32, help="connects / POSTs in flight at once")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds each phase's clients may take")
    parser.add_argument("--results", default=str(RESULTS), help="where the JSON goes")
    args = parser.parse_args()

    raise_open_files(args.clients)
    # Two phases, a site start with migrations, and slack: then stop no matter what.
    start_watchdog(2 * args.timeout + 300)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    bare = run_bare(args)
    chat = run_chatsite(args)

    targets = {
        "every chatsite stream complete and in order": chat["complete"] == args.clients,
        f"chatsite peak RSS <= {RSS_TARGET_MB:.0f} MB": chat["peak_rss_mb"] <= RSS_TARGET_MB,
        f"chatsite tokens/s >= {THROUGHPUT_TARGET} x bare events/s (steady state)": (chat["steady_tokens_per_s"] or 0)
        >= THROUGHPUT_TARGET * (bare["steady_events_per_s"] or float("inf")),
    }
    result = {
        "command": shlex.join(["python", "-m", "bench.fanout", *sys.argv[1:]]),
        "args": vars(args),
        "date": started,
        "cpu_count": os.cpu_count(),
        "bare": bare,
        "chatsite": chat,
        "throughput_ratio": (chat["steady_tokens_per_s"] or 0) / bare["steady_events_per_s"]
        if bare["steady_events_per_s"]
        else None,
        "whole_window_ratio": chat["tokens_per_s"] / bare["events_per_s"] if bare["events_per_s"] else None,
        "targets": targets,
        "all_targets_met": all(targets.values()),
    }
    Path(args.results).parent.mkdir(exist_ok=True)
    Path(args.results).write_text(json.dumps(result, indent=2) + "\n")
    print_table(bare, chat, targets, args)
    ratio = result["throughput_ratio"]
    print(f"steady-state ratio chatsite tokens/s ÷ bare events/s: {'-' if ratio is None else f'{ratio:.3f}'}")
    whole = result["whole_window_ratio"]
    print(f"whole-window ratio (includes connection ramp): {'-' if whole is None else f'{whole:.3f}'}")
    print(f"results written to {args.results}")
    sys.exit(0 if result["all_targets_met"] else 1)


if __name__ == "__main__":
    main()
