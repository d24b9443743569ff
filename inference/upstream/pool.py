"""Generations on OpenAI-compatible model servers: vLLM, TGI, Ollama, llama.cpp,
`transformers serve`, another chatsite.

An `UpstreamPool` streams each generation from one of its model's endpoints and appends
the same numbered events to the stream store as the engine does (`status` while it
waits, `token`, `tool_call`, then one `done` or `error`), calling the job's save
callbacks first, so that readers, resume, Stop and the ledger never know where it ran.
A chat answer with tools runs its model's calls itself instead of streaming them
(`tool_start`, `tool_result`), and asks the model again with their results
(inference/tool_loop.py).

- Routing: the endpoint with the fewest outstanding requests per unit of weight, under
  its `max_concurrent`; when every endpoint is full the request waits in line (told its
  place), taken by priority, then in turns across users (inference/fair_queue.py), up to
  `max_queue` waiting; with no endpoint available at all it is refused.
- Failures: a failure before the first token (refused connection, 5xx, timeout) fails
  over to another endpoint, unseen by the client; after it, the stream ends with an
  `error` event and the text so far is kept. `failure_threshold` consecutive failures
  open an endpoint's circuit for `open_s`; then one request probes it (half-open). A 500
  fails over too but opens no circuit: it answers for one request, not for the server.
- Health: every `health_interval_s` each endpoint's `/models` is asked; one that does
  not answer is skipped until it does. A check that times out while requests are in
  flight leaves the endpoint as it was: a server that serves one request at a time
  (llama.cpp) makes the check wait behind the request in hand, silent while it reads a
  long prompt; those requests' own timeouts and the circuit judge it meanwhile.
- Stop: one look at the store's cancel flags every `cancel_poll_s` for all running
  generations; a cancelled one closes its HTTP request, so the server aborts it.

Everything runs on one asyncio loop, with one kept connection pool: the web server's
own where it asks for it (`serve_on_running_loop`: then a chunk wakes no other thread on
its way to the reader), else one in a thread of the pool's. The client is aiohttp rather
than httpx: streaming a chunk costs it about a third of httpx's CPU (76 against 230 µs
here, `docs/benchmarks.md`), CPU that a model server on the same machine would otherwise
lose. No Django imports here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp

from inference.backend import LedgerVerdict
from inference.engine import (
    CONTENT_FILTER,
    INTERRUPTED,
    EngineOverloaded,
    GenerationResult,
    Job,
    failure_message,
)
from inference.fair_queue import FairQueue
from inference.streams import PRODUCER_BEAT_S, PRODUCER_BEAT_TTL_S, GenerationStatus, StreamStore, interrupted_event
from inference.tool_loop import (
    ToolCall,
    ToolCallGatherer,
    ToolOutcome,
    ToolRunner,
    ToolStatus,
    next_round_body,
    tool_event,
    tool_round_messages,
)
from inference.upstream.endpoints import Circuit, Endpoint, EndpointState, NoEndpointAvailable, UpstreamFailed
from inference.upstream.wire import client_session, estimate_tokens, json_chunks, openai_tool_call_deltas

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class _Run:
    job: Job
    model: str
    prompt_tokens: int  # as counted at admission, for when the server reports no usage
    count_tokens: Callable[[str], int] | None  # the answer's, likewise; None: estimated
    task: asyncio.Task[None] | None = None
    cancelled: bool = False
    interrupted: bool = False  # by the server's shutdown (UpstreamPool.shut_down)
    pieces: list[str] = field(default_factory=list)
    output_chunks: int = 0  # chunks with text or tool calls: one token each from the usual servers
    first_token_at: float | None = None
    taken_at: float | None = None  # when an endpoint's slot took it
    last_progress: float = field(default_factory=time.monotonic)
    usage: dict[str, int] | None = None
    finish_reason: str = "stop"
    admission: LedgerVerdict | None = None  # when it started before its admission was written
    max_tokens: int | None = None  # as sent to the server
    tool_calls_begun: set[int] = field(default_factory=set)  # the indexes of its tool calls so far
    tool_call_text: list[str] = field(default_factory=list)  # their names and arguments, to count
    # Where its tool calls run (inference/tool_loop.py); None: they are streamed to the client.
    tools: ToolRunner | None = None
    gathered: ToolCallGatherer = field(default_factory=ToolCallGatherer)
    tool_rounds: int = 0  # rounds of calls run so far
    tool_calls_run: int = 0  # the calls of those rounds, counted on its usage record
    round_began: int = 0  # the index in `pieces` where this round's text begins
    past_usage: dict[str, Any] = field(default_factory=dict)  # the usage of the rounds before this one

    @property
    def priority(self) -> int:
        return self.job.priority

    @property
    def owner(self) -> str:
        return self.job.owner

    def capped(self) -> bool:
        """Whether it has the tokens its admission granted, when that is fewer than were asked
        for (counted by the server's chunks)."""
        granted = self.admission.max_tokens if self.admission else None
        return granted is not None and self.max_tokens is not None and self.output_chunks >= granted < self.max_tokens

    def filtered(self) -> bool:
        """Whether its text filter ended the answer (leaving closes the request, as capped)."""
        return self.job.text_filter is not None and self.job.text_filter.blocked


class UpstreamPool:
    # Beats live three periods, as the engine's: the reaper tells a dead process's runs by them.

    def __init__(
        self,
        store: StreamStore,
        *,
        producer: str = "upstream",
        max_queue: int = 64,
        failure_threshold: int = 3,
        open_s: float = 30.0,
        health_interval_s: float = 10.0,
        cancel_poll_s: float = 0.05,
        progress_interval_s: float = 2.0,
    ) -> None:
        self.store = store
        self.producer = producer
        self.max_queue = max_queue
        self.failure_threshold, self.open_s = failure_threshold, open_s
        self.health_interval_s = health_interval_s
        self.cancel_poll_s = cancel_poll_s
        self.progress_interval_s = progress_interval_s
        self._lock = threading.Lock()
        self._states: dict[str, EndpointState] = {}  # by endpoint name
        self._waiting: dict[str, FairQueue[_Run]] = {}  # by model, in the order they are taken
        self._runs: dict[str, _Run] = {}  # running or waiting, by stream id
        self._stopping = False  # shut_down(): new requests are refused
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None  # the loop's, when the pool runs its own
        self._serving = False  # its loop runs its session, waiting room and background tasks
        self._client: aiohttp.ClientSession | None = None
        self._resend_client: aiohttp.ClientSession | None = None  # new connections only (`_post`)
        self._room: asyncio.Condition | None = None
        self._background: list[asyncio.Task[None]] = []
        # Events published on the loop during one of its turns, appended together at its end:
        # the streams' chunks of one read of the sockets wake their readers once, and cost
        # a Redis store one round trip.
        self._outbox: list[tuple[str, str, dict[str, Any]]] = []
        # Saves and terminal events in order, off the loop: a slow database never stalls streams.
        self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chatsite-upstream-finish")
        self.generated_tokens = 0

    # -- configuration, from any thread ------------------------------------------------

    def configure(self, endpoints: list[Endpoint]) -> None:
        """Serve exactly these endpoints; an unchanged one keeps its state and requests."""
        with self._lock:
            states = {}
            for endpoint in endpoints:
                kept = self._states.get(endpoint.name)
                if kept is not None and kept.endpoint == endpoint:
                    states[endpoint.name] = kept
                else:
                    state = EndpointState(endpoint, Circuit(self.failure_threshold, self.open_s))
                    if kept is not None:  # changed settings; its requests still count against it
                        state.outstanding = kept.outstanding
                    states[endpoint.name] = state
            self._states = states
        self._wake()

    def models(self) -> list[str]:
        with self._lock:
            return sorted({state.endpoint.model for state in self._states.values()})

    def endpoints(self, model: str) -> list[Endpoint]:
        with self._lock:
            return [state.endpoint for state in self._states.values() if state.endpoint.model == model]

    def snapshots(self) -> list[dict[str, Any]]:
        with self._lock:
            return [state.snapshot() for state in sorted(self._states.values(), key=lambda s: s.endpoint.name)]

    def load(self, model: str) -> tuple[int, int, int]:
        """(requests running, waiting, rows the endpoints take at once) for `model`."""
        with self._lock:
            states = [s for s in self._states.values() if s.endpoint.model == model]
            waiting = len(self._waiting.get(model, ()))
            return sum(s.outstanding for s in states), waiting, sum(s.endpoint.max_concurrent for s in states)

    # -- submitting, from request threads ------------------------------------------------

    def submit(
        self,
        job: Job,
        *,
        model: str,
        prompt_tokens: int,
        body: dict[str, Any],
        count_tokens: Callable[[str], int] | None = None,
        admission: LedgerVerdict | None = None,
        tools: ToolRunner | None = None,
    ) -> None:
        """Start streaming `body` (an OpenAI request without model and stream fields) from
        one of `model`'s endpoints. Raises NoEndpointAvailable, or EngineOverloaded when
        `max_queue` requests already wait for room. `prompt_tokens` and `count_tokens`
        count the usage if the server reports none. With `tools`, the model's tool calls
        are run by it and the model continues with their results (`_tool_round`)."""
        with self._lock:
            if self._stopping:
                raise EngineOverloaded("the server is shutting down")
            states = [s for s in self._states.values() if s.endpoint.model == model and s.available()]
            if not states:
                raise NoEndpointAvailable(f"no endpoint of {model!r} is available")
            waiting = len(self._waiting.get(model, ()))
            room = any(s.outstanding < s.endpoint.max_concurrent for s in states)
            if not room and waiting >= self.max_queue:
                raise EngineOverloaded(f"{waiting} requests already wait for {model!r}")
            run = _Run(job, model, prompt_tokens, count_tokens, admission=admission, max_tokens=body.get("max_tokens"))
            run.tools = tools
            self._runs[job.stream_id] = run
        self.store.create(job.stream_id)
        loop = self._started_loop()
        asyncio.run_coroutine_threadsafe(self._start(run, body), loop)

    def shut_down(self, grace_s: float) -> None:
        """As Engine.shut_down: refuse new requests; let those under way finish for up to
        `grace_s` seconds; close the rest as interrupted, their text kept; wait for the saves.
        Then its health checks, heartbeat and connections end: a stopped pool asks nothing
        of its servers, and beats for no one."""
        with self._lock:
            self._stopping = True
        deadline = time.monotonic() + grace_s
        while self._runs and time.monotonic() < deadline:
            time.sleep(0.05)
        with self._lock:
            left = list(self._runs.values())
        for run in left:
            run.interrupted = True
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._cancel, run)
        deadline = time.monotonic() + 10  # a closed request ends within the loop's next turns
        while self._runs and time.monotonic() < deadline:
            time.sleep(0.05)
        self._finisher.shutdown(wait=True)
        self._end_serving()

    def _end_serving(self) -> None:
        with self._lock:
            loop, serving, self._serving = self._loop, self._serving, False
        if loop is None or not serving or not loop.is_running():
            return
        with contextlib.suppress(RuntimeError):
            if asyncio.get_running_loop() is loop:  # called on the loop itself: it cannot wait
                loop.create_task(self._close())
                return
        with contextlib.suppress(Exception):  # a loop that stops meanwhile closes nothing more
            asyncio.run_coroutine_threadsafe(self._close(), loop).result(timeout=5)
        if self._thread is not None:  # the pool's own loop and thread end too
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(timeout=5)

    async def _close(self) -> None:
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        self._background = []
        for client in (self._client, self._resend_client):
            if client is not None:
                await client.close()

    def _cancel(self, run: _Run) -> None:
        """On the loop: stop a run (one not begun yet stops as it begins)."""
        if not run.cancelled:
            run.cancelled = True
            if run.task is not None:
                run.task.cancel()  # closes its HTTP request: the server stops generating

    def serve_on_running_loop(self) -> None:
        """Stream on the loop this is called on (a web server's, where the streams' readers
        wait) instead of on a thread of the pool's own. Each chunk is then read, published
        and written to its readers in one thread: no other thread is woken for it, which
        on a machine the model server shares costs it less (docs/benchmarks.md). Call it
        before the first submit; once the pool runs, it changes nothing."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.get_running_loop()

    def _started_loop(self) -> asyncio.AbstractEventLoop:
        """The pool's loop, serving. The first call starts it: a thread of the pool's own
        with its loop, unless serve_on_running_loop gave it one. (Not before: its health
        checks begin with its first request, wherever it runs.)"""
        with self._lock:
            if self._loop is None:
                ready = threading.Event()
                self._thread = threading.Thread(
                    target=self._serve, args=(ready,), name="chatsite-upstream", daemon=True
                )
                self._thread.start()
                ready.wait()
            elif not self._serving:
                self._loop.call_soon_threadsafe(self._begin_serving)  # before the request that follows
            self._serving = True
            assert self._loop is not None
            return self._loop

    def _serve(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        loop.call_soon(self._begin_serving)
        loop.call_soon(ready.set)
        loop.run_forever()

    def _begin_serving(self) -> None:
        """On the pool's loop: its HTTP session, its waiting room, its background tasks."""
        loop = asyncio.get_running_loop()
        self._client = client_session()
        self._resend_client = client_session(new_connections=True)
        self._room = asyncio.Condition()
        self._background = [
            loop.create_task(self._poll_cancels()),
            loop.create_task(self._check_health()),
            loop.create_task(self._beat()),
        ]

    def _wake(self) -> None:
        """Let waiting requests look again for room (from any thread)."""
        if self._serving and self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._notify(), self._loop)

    async def _notify(self) -> None:
        assert self._room is not None
        async with self._room:
            self._room.notify_all()

    # -- one generation, on the loop -----------------------------------------------------

    async def _start(self, run: _Run, body: dict[str, Any]) -> None:
        run.task = asyncio.current_task()
        tried: set[str] = set()
        failure: UpstreamFailed | None = None
        try:
            if run.cancelled:
                raise asyncio.CancelledError  # stopped before it began
            while True:
                state = await self._acquire(run, tried)
                if state is None:
                    failure = failure or UpstreamFailed(
                        f"No endpoint of {run.model!r} is available.", status=503, code="server_overloaded"
                    )
                    break
                tried.add(state.endpoint.name)
                try:
                    await self._stream(run, state, body)
                    failure = None
                except UpstreamFailed as error:
                    failure = error
                    # Once the client has seen tokens, no quiet retry any more.
                    final = run.first_token_at is not None or not error.retry
                    logger.warning(
                        "Upstream %s failed generation %s: %s%s",
                        state.endpoint.name,
                        run.job.stream_id,
                        error.detail,
                        "" if final else "; failing over",
                    )
                    if final:
                        break
                except Exception:
                    # A chunk of a shape no server should send, or a fault of chatsite's own:
                    # the answer ends with an error (the log has why) instead of never ending.
                    logger.exception("Generation %s failed on upstream %s", run.job.stream_id, state.endpoint.name)
                    failure = UpstreamFailed(failure_message(run.job.stream_id), retry=False)
                    break
                finally:
                    await self._release(state)
                if failure is not None:
                    continue  # another endpoint takes it
                # Its tool calls run with the endpoint's slot given back (a call may wait
                # minutes for its Approve); the next round waits its turn for one again.
                try:
                    following = await self._tool_round(run, body)
                except Exception:
                    logger.exception("The tool round of generation %s failed", run.job.stream_id)
                    failure = UpstreamFailed(failure_message(run.job.stream_id), retry=False)
                    break
                if following is None:
                    break
                body, tried = following, set()
        except asyncio.CancelledError:
            if not run.cancelled:
                raise
            run.finish_reason = "cancelled"
        self._finish(run, failure)

    async def _tool_round(self, run: _Run, body: dict[str, Any]) -> dict[str, Any] | None:
        """Run the calls a round of a run with tools ended with, each told as a `tool_start`
        and a `tool_result` event; the next round's request, or None: the answer is complete
        (no calls, the rounds or the tokens used up)."""
        calls = run.gathered.calls()
        if run.tools is None or not calls or run.tool_rounds >= run.tools.max_rounds or run.capped():
            return None
        left = None if run.max_tokens is None else run.max_tokens - run.output_chunks
        if left is not None and left < 1:
            return None
        run.tool_rounds += 1
        run.tool_calls_run += len(calls)
        outcomes = []
        for call in calls:
            self._publish(run.job.stream_id, "tool_start", tool_event(call, None, round_number=run.tool_rounds))
            outcome = await self._tool_outcome(run, call)
            outcomes.append(outcome)
            self._publish(run.job.stream_id, "tool_result", tool_event(call, outcome, round_number=run.tool_rounds))
        added = tool_round_messages("".join(run.pieces[run.round_began :]), calls, outcomes)
        following = next_round_body(body, added, last=run.tool_rounds >= run.tools.max_rounds)
        if left is not None:
            following["max_tokens"] = left
        # The next round starts afresh: its calls' indexes, its text, its usage; the server
        # reads the whole conversation again, results included (counted if it reports nothing).
        run.gathered.clear()
        run.tool_calls_begun = set()
        run.round_began = len(run.pieces)
        run.past_usage = _usage_added(run.past_usage, run.usage or {})
        run.usage = None
        run.prompt_tokens += sum(estimate_tokens(json.dumps(message)) for message in following["messages"])
        run.finish_reason = "stop"
        return following

    async def _tool_outcome(self, run: _Run, call: ToolCall) -> ToolOutcome:
        assert run.tools is not None

        def tell(status: ToolStatus) -> None:  # a later tool_start of the same call: its new status
            event = tool_event(call, None, round_number=run.tool_rounds, status=status)
            self._publish(run.job.stream_id, "tool_start", event)

        try:
            return await run.tools.run(call, round_number=run.tool_rounds, tell=tell)
        except Exception:  # the runner's own fault: that call fails, not the answer
            logger.exception("Tool call %s (%s) failed", call.id, call.name)
            return ToolOutcome(ok=False, text=f"The tool {call.name!r} failed.")

    async def _acquire(self, run: _Run, tried: set[str]) -> EndpointState | None:
        """The endpoint to try next, waiting in line while all are full; None if none is left."""
        assert self._room is not None
        told: int | None = None
        async with self._room:
            while True:
                with self._lock:
                    candidates = [
                        s
                        for s in self._states.values()
                        if s.endpoint.model == run.model and s.endpoint.name not in tried and s.available()
                    ]
                    if not candidates:
                        self._leave_line(run)
                        return None
                    line = self._waiting.setdefault(run.model, FairQueue())
                    joined = run not in line
                    if joined:
                        line.append(run)
                    free = [s for s in candidates if s.outstanding < s.endpoint.max_concurrent]
                    if free and line[0] is run:
                        chosen = min(free, key=lambda s: (s.outstanding + 1) / s.endpoint.weight)
                        chosen.outstanding += 1
                        chosen.requests += 1
                        chosen.circuit.taken()
                        line.popleft()
                        news = told is not None
                    else:
                        ahead = line.index(run)
                        chosen, news = None, False
                    # The others' places moved: it left the line, or joined it ahead of some.
                    moved = len(line) > 0 if chosen is not None else joined and len(line) > ahead + 1
                if moved:
                    self._room.notify_all()
                if chosen is not None:
                    run.taken_at = run.taken_at or time.monotonic()
                    if news:
                        self._publish(run.job.stream_id, "status", {"state": "running"})
                    return chosen
                if ahead != told:
                    told = ahead
                    self._publish(run.job.stream_id, "status", {"state": "queued", "ahead": ahead})
                await self._room.wait()

    def _leave_line(self, run: _Run) -> bool:
        """Take a run out of its model's line without its turn; whether it was in it."""
        line = self._waiting.get(run.model)
        if line is not None and run in line:
            line.remove(run)
            return True
        return False

    async def _release(self, state: EndpointState) -> None:
        with self._lock:
            state.outstanding -= 1
        await self._notify()

    async def _stream(self, run: _Run, state: EndpointState, body: dict[str, Any]) -> None:
        """Stream one attempt; UpstreamFailed when the endpoint fails it."""
        endpoint = state.endpoint
        chat = "messages" in body
        url = endpoint.url("chat/completions" if chat else "completions")
        request = {
            **body,
            "model": endpoint.upstream_model,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        # No total: an answer streams for as long as it takes, each silence bounded.
        timeout = aiohttp.ClientTimeout(sock_connect=endpoint.connect_timeout_s, sock_read=endpoint.read_timeout_s)
        assert self._client is not None
        started = time.monotonic()
        try:
            async with contextlib.AsyncExitStack() as stack:
                async with asyncio.timeout(endpoint.first_token_timeout_s) as first_token:
                    response = await self._post(stack, endpoint, url, request, timeout)
                    if response.status >= 400:
                        raise await self._refusal(response, run)
                    chunks = json_chunks(response)
                    async for chunk in chunks:
                        if self._take(run, chunk, chat):
                            break  # the first token: from now on only the read timeout applies
                    first_token.reschedule(None)
                self._note_success(state, time.monotonic() - started)
                if not (run.capped() or run.filtered()):
                    async for chunk in chunks:
                        self._take(run, chunk, chat)
                        if run.capped() or run.filtered():
                            break
                if run.filtered():
                    run.finish_reason = CONTENT_FILTER
                elif run.capped():  # leaving closes the request: the server stops
                    run.finish_reason = "length"
        except aiohttp.ClientError as error:
            # Before TimeoutError: a silence past `read_timeout_s` (ServerTimeoutError) is
            # both, and fails over like a refused connection.
            self._note_failure(state)
            raise UpstreamFailed(
                failure_message(run.job.stream_id), detail=f"{type(error).__name__}: {error}"
            ) from None
        except TimeoutError:
            self._note_failure(state)
            if run.first_token_at is None:
                raise UpstreamFailed(
                    f"The model server gave no first token within {endpoint.first_token_timeout_s:g} s.",
                    status=504,
                    code="upstream_timeout",
                ) from None
            raise UpstreamFailed("The model server went silent mid-answer.", code="upstream_timeout") from None
        except UpstreamFailed as error:
            if error.retry:  # a refusal of this request is no fault of the endpoint's
                self._note_failure(state, opens_circuit=error.opens_circuit)
            raise

    async def _post(
        self,
        stack: contextlib.AsyncExitStack,
        endpoint: Endpoint,
        url: str,
        request: dict[str, Any],
        timeout: aiohttp.ClientTimeout,
    ) -> aiohttp.ClientResponse:
        """The server's response to the request, sent once more, on a new connection, when
        the kept-alive connection it went out on turns out closed by the server before any
        answer.

        A server may close an idle connection just as it is taken from the pool (llama.cpp's
        server was seen to, between two requests); aiohttp then fails the request, and
        retries only idempotent ones, not a POST (RFC 9112, 9.3.1.1). A completion the
        server never answered is safe to ask again, and it is no fault of the endpoint's.
        The second try takes a connection of its own: the pool may hold more that the
        server closed. A failure to connect is not retried: that one is the endpoint's."""
        assert self._client is not None and self._resend_client is not None

        async def post(client: aiohttp.ClientSession) -> aiohttp.ClientResponse:
            return await stack.enter_async_context(
                client.post(
                    url,
                    json=request,
                    headers=endpoint.headers,
                    proxy=endpoint.proxy,
                    proxy_auth=endpoint.proxy_auth,
                    timeout=timeout,
                )
            )

        try:
            return await post(self._client)
        except aiohttp.ClientConnectorError:
            raise
        except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
            logger.info("Upstream %s closed a kept-alive connection under a request; sending it again", endpoint.name)
        return await post(self._resend_client)

    async def _refusal(self, response: aiohttp.ClientResponse, run: _Run) -> UpstreamFailed:
        """The server's own error: a 4xx is the request's fault (no retry elsewhere)."""
        text = await response.text(errors="replace")
        try:
            message = json.loads(text)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = text[:300] or response.reason or ""
        if response.status < 500 and response.status != 429:
            return UpstreamFailed(
                f"The model server refused: {message}", status=400, code="upstream_refused", retry=False
            )
        detail = f"HTTP {response.status}: {message}"
        # A 500 is the server's answer about this request (llama.cpp's to a request it cannot
        # parse, say): another endpoint may take it, but it opens no circuit, or a few bad
        # requests of one user would shut an endpoint for everyone. A server down, overloaded
        # or timing out (connection errors, 502-504, 429) does.
        answered = response.status in (500, 501)
        return UpstreamFailed(failure_message(run.job.stream_id), detail=detail, opens_circuit=not answered)

    def _take(self, run: _Run, chunk: dict[str, Any], chat: bool) -> bool:
        """Publish one upstream chunk; whether it carried output (text or a tool call)."""
        if "error" in chunk:
            message = chunk["error"].get("message", "error") if isinstance(chunk["error"], dict) else chunk["error"]
            raise UpstreamFailed(failure_message(run.job.stream_id), detail=f"mid-answer: {message}")
        if chunk.get("usage"):
            run.usage = chunk["usage"]
        output = False
        for choice in chunk.get("choices") or []:
            delta = (choice.get("delta") or {}) if chat else {"content": choice.get("text")}
            text = delta.get("content") or ""
            logprobs = (choice.get("logprobs") or {}).get("content")
            # A chunk the text filter holds back is output all the same: the server has begun.
            output = output or bool(text)
            if run.job.text_filter is not None:  # its logprobs would carry the text it holds back
                text, logprobs = ("" if run.filtered() else run.job.text_filter.feed(text)), None
            if text or logprobs:
                data: dict[str, Any] = {"delta": text}
                if logprobs:
                    data["logprobs"] = logprobs
                self._publish(run.job.stream_id, "token", data)
                run.pieces.append(text)
                output = True
            if delta.get("tool_calls"):
                calls = openai_tool_call_deltas(delta["tool_calls"], run.tool_calls_begun)
                run.tool_call_text += [
                    (call.get("function") or {}).get(part) or "" for call in calls for part in ("name", "arguments")
                ]
                if run.tools is None:
                    self._publish(run.job.stream_id, "tool_call", {"tool_calls": calls})
                else:  # run here once the round ends (_tool_round)
                    run.gathered.add(calls)
                output = True
            if choice.get("finish_reason"):
                run.finish_reason = choice["finish_reason"]
        now = time.monotonic()
        run.output_chunks += output
        if output and run.first_token_at is None:
            run.first_token_at = now
        if run.job.on_progress and run.pieces and now - run.last_progress >= self.progress_interval_s:
            run.last_progress = now
            self._finisher.submit(_call_safely, run.job.on_progress, "".join(run.pieces))
        return output

    def _note_success(self, state: EndpointState, ttft_s: float) -> None:
        with self._lock:
            state.circuit.succeeded()
            state.ttft_s = ttft_s if state.ttft_s is None else 0.8 * state.ttft_s + 0.2 * ttft_s

    def _note_failure(self, state: EndpointState, *, opens_circuit: bool = True) -> None:
        with self._lock:
            state.errors += 1
            if opens_circuit:
                state.circuit.failed()

    def _finish(self, run: _Run, failure: UpstreamFailed | None) -> None:
        if run.job.text_filter is not None and (held := run.job.text_filter.flush()):
            self._publish(run.job.stream_id, "token", {"delta": held})
            run.pieces.append(held)
        self._flush()  # its last chunks go before its terminal event, which the finisher appends
        with self._lock:
            self._runs.pop(run.job.stream_id, None)
            waited = self._leave_line(run)
        if waited:
            self._wake()  # the runs that waited behind it are told their new places
        text = "".join(run.pieces)
        usage = _usage_added(run.past_usage, run.usage or {})
        count = run.count_tokens or estimate_tokens
        estimated = not usage and run.count_tokens is None
        prompt_tokens = int(usage.get("prompt_tokens", run.prompt_tokens))
        if "completion_tokens" in usage:
            completion_tokens = int(usage["completion_tokens"])
        else:  # counted here: the text and the tool calls, never more than the server was let write
            completion_tokens = count(text + "".join(run.tool_call_text))
            completion_tokens = min(completion_tokens, run.max_tokens or completion_tokens)
        started = run.job.submitted_at
        if failure is not None:
            status, finish_reason, error = GenerationStatus.ERROR, "error", str(failure)
        elif run.interrupted:
            status, finish_reason, error = GenerationStatus.INTERRUPTED, "error", INTERRUPTED
        elif run.finish_reason == "cancelled":
            status, finish_reason, error = GenerationStatus.STOPPED, "cancelled", ""
        else:
            status, finish_reason, error = GenerationStatus.COMPLETE, run.finish_reason, ""
        result = GenerationResult(
            text=text,
            status=status,
            finish_reason=finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=min(_cached_tokens(usage), prompt_tokens),
            ttft_s=None if run.first_token_at is None else run.first_token_at - started,
            queue_wait_s=None if run.taken_at is None else run.taken_at - started,
            error_code=failure.code if failure is not None else None,
            duration_s=time.monotonic() - started,
            error=error,
            usage_estimated=estimated,
            tool_calls=run.tool_calls_run,
        )
        self._finisher.submit(self._end, run.job, result, failure)

    def _end(self, job: Job, result: GenerationResult, failure: UpstreamFailed | None) -> None:
        """Save, then publish the terminal event (so a reader that sees it finds the save)."""
        if job.on_finish:
            _call_safely(job.on_finish, result)
        self.generated_tokens += result.completion_tokens
        summary = {**result.summary(), "usage_estimated": result.usage_estimated}
        if failure is not None:
            data = {"message": result.error, "status_code": failure.status, "code": failure.code, **summary}
            self._append(job.stream_id, "error", data)
        elif result.status == GenerationStatus.INTERRUPTED:  # as the engine's and the reaper's
            self._append(job.stream_id, *interrupted_event(**summary))
        else:
            self._append(job.stream_id, "done", summary)

    def _append(self, stream_id: str, type: str, data: dict[str, Any]) -> None:
        try:
            self.store.append(stream_id, type, data)
        except Exception:  # e.g. Redis unreachable, or a stream ended from outside: the pool lives on
            logger.exception("Could not publish %s to stream %s", type, stream_id)

    def _publish(self, stream_id: str, type: str, data: dict[str, Any]) -> None:
        """On the loop: append an event at the end of this turn of the loop."""
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append((stream_id, type, data))

    def _flush(self) -> None:
        """On the loop: append the events published so far, in order."""
        events, self._outbox = self._outbox, []
        if not events:
            return
        try:
            results = self.store.append_many(events)
        except Exception:  # e.g. Redis unreachable: the pool lives on
            logger.exception("Could not publish %d events", len(events))
            return
        for (stream_id, type, _), result in zip(events, results, strict=True):
            if isinstance(result, Exception):  # e.g. a stream ended from outside
                logger.error("Could not publish %s to stream %s: %s", type, stream_id, result)

    # -- background tasks ----------------------------------------------------------------

    async def _in_store(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A store call from the loop: on a thread where it may wait on the network; a store
        in memory answers at once, and a thread woken for it 20 times a second would cost
        a model server on the same machine more than the look itself."""
        if self.store.local:
            return call(*args, **kwargs)
        return await asyncio.to_thread(call, *args, **kwargs)

    async def _poll_cancels(self) -> None:
        """One look at the cancel flags of every running generation per period."""
        while True:
            await asyncio.sleep(self.cancel_poll_s)
            with self._lock:
                runs = dict(self._runs)
            if not runs:
                continue
            try:
                cancelled = await self._in_store(self.store.cancelled_among, list(runs))
            except Exception:
                logger.exception("Could not read the cancel flags; looking again shortly")
                continue
            for stream_id in cancelled:
                self._cancel(runs[stream_id])

    async def _beat(self) -> None:
        """Beat as `producer` while serving, as the engine does, so that the reaper never
        settles this process's runs as a dead one's (a web process of the Celery backend
        has no engine beating for it)."""
        while True:
            try:
                await self._in_store(self.store.beat, self.producer, ttl_s=PRODUCER_BEAT_TTL_S)
            except Exception:
                logger.exception("Upstream heartbeat failed")
            await asyncio.sleep(PRODUCER_BEAT_S)

    async def _check_health(self) -> None:
        assert self._client is not None
        while True:
            with self._lock:
                states = list(self._states.values())
            for state in states:
                endpoint = state.endpoint
                url = endpoint.url("models")
                timeout = aiohttp.ClientTimeout(total=endpoint.connect_timeout_s)
                try:
                    async with self._client.get(
                        url,
                        headers=endpoint.headers,
                        proxy=endpoint.proxy,
                        proxy_auth=endpoint.proxy_auth,
                        timeout=timeout,
                    ) as response:
                        await response.read()  # all of it: the connection goes back to the pool
                        healthy = response.status < 500
                except TimeoutError:
                    # With requests in flight the check proves nothing: a server that serves
                    # one request at a time (llama.cpp, say) answers it only after the answer
                    # it is reading a long prompt for or writing. Those requests' own timeouts
                    # and the circuit judge it meanwhile; an idle server that is silent is down.
                    healthy = state.healthy and state.outstanding > 0
                except aiohttp.ClientError:
                    healthy = False
                except Exception:  # anything else must not end the checks, freezing every state
                    logger.exception("Health check of upstream %s failed", endpoint.name)
                    healthy = False
                with self._lock:
                    if state.healthy != healthy:
                        logger.warning("Upstream %s is %s", endpoint.name, "up" if healthy else "down")
                    state.healthy = healthy
            await self._notify()
            await asyncio.sleep(self.health_interval_s)


def _usage_added(earlier: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    """The usage of a tool loop's rounds so far: each count added up."""
    if not earlier:
        return usage
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    added: dict[str, Any] = {
        key: int(earlier.get(key, 0)) + int(usage.get(key, 0)) for key in counts if key in earlier or key in usage
    }
    if cached := _cached_tokens(earlier) + _cached_tokens(usage):
        added["prompt_tokens_details"] = {"cached_tokens": cached}
    return added


def _cached_tokens(usage: dict[str, Any]) -> int:
    """The prompt's tokens a model server says it did not run again (OpenAI's
    `prompt_tokens_details.cached_tokens`: vLLM's and llama-server's prefix caches), else 0."""
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) and cached > 0 else 0


def _call_safely(callback: Callable[[Any], None], argument: Any) -> None:
    try:
        callback(argument)
    except Exception:
        logger.exception("Upstream generation callback %r failed", callback)
