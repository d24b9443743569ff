"""Real OpenAI-compatible servers for chatsite to put behind its API, in tests and benchmarks.

`TransformersServe` runs `transformers serve` on the weights chatsite itself loads, on CPU
in float32; `LlamaCppServer` runs llama.cpp's OpenAI-compatible server (llama-cpp-python) on
the packaged model's GGUF file, a server that does tool calls, JSON modes and logprobs;
`SilentServer` takes connections and requests and never answers, as a hung upstream does;
`ScriptedServer` answers as a test says (aiohttp's server), for a model server's failures.
Each listens on a free loopback port and exposes `base_url`, ending in /v1.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
from aiohttp import web

from inference.loading import COMPLETE_MARKER, assemble_gguf
from inference.registry import resolve_model
from tests.support.livesite import ROOT, free_port, stop_process

APP_MODEL = "smollm2-135m-instruct"
PAGE_SIZE = 256  # tokens per KV-cache block: ContinuousBatchingConfig's default
PROMPT_ALLOWANCE = 128  # tokens: the chat template's system prompt plus a short prompt, with room

LOCATE_MODEL = """
from django.conf import settings
from inference.loading import assemble_gguf, file_sha256
from inference.registry import resolve_model
spec = resolve_model(settings.CHAT_MODEL)
print(spec.source or settings.MODEL_CACHE_DIR / file_sha256(assemble_gguf(spec, settings.MODEL_CACHE_DIR)))
"""


def prepared_model_dir(app_model: str = APP_MODEL) -> Path:
    """The converted safetensors + tokenizer directory chatsite loads for `app_model`,
    converted first (`manage.py prepare_model`) if it is not there yet."""
    env = {**os.environ, "CHAT_MODEL": app_model}

    def locate() -> Path:
        output = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", LOCATE_MODEL],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return Path(output.strip().splitlines()[-1]).resolve()

    path = locate()
    if not (path / COMPLETE_MARKER).exists():
        subprocess.run([sys.executable, "manage.py", "prepare_model"], cwd=ROOT, env=env, check=True)
        path = locate()
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"no converted model in {path}")
    return path


def paged_cache_blocks(max_streams: int, max_tokens: int) -> int:
    """KV-cache blocks for `max_streams` streams of `max_tokens` at once, plus a few spare.

    Left to its default, the paged cache takes a share of the whole machine's memory."""
    return max_streams * math.ceil((PROMPT_ALLOWANCE + max_tokens) / PAGE_SIZE) + 8


def wait_until_answering(
    process: subprocess.Popen[bytes], url: str, deadline: float, *, name: str, log: Callable[[], str]
) -> None:
    """Wait for `url` to answer 200; RuntimeError if the server exits, TimeoutError at `deadline`."""
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{log()}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{name}: {url} did not answer in time:\n{log()}")


class TransformersServe:
    """`with TransformersServe() as upstream:` starts `transformers serve` pinned to chatsite's
    model, waits for /health and sends one warm-up request (its first one is slow).

    Requests name the model as `upstream.model` (the served directory's path): a server
    pinned to a model answers 400 to any other name. With `continuous_batching`, the
    paged cache holds `max_streams` streams of `max_tokens`, and the warm-up request is
    greedy because the first request's sampling settings are kept for all later ones.
    A prompt longer than that cache kills its batching worker for good: that stream
    ends with an error event and every later request is answered 503.

    It reports no count of the generations it is running (no metrics endpoint): a test
    that needs one uses a chatsite process as the upstream, whose /metrics has it.
    """

    def __init__(
        self,
        *,
        app_model: str = APP_MODEL,
        continuous_batching: bool = False,
        max_streams: int = 16,
        max_tokens: int = 128,
        max_batch_tokens: int = 512,
        ready_timeout: float = 300,
        cpus: str | None = None,
    ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="transformers-serve-")
        self.cpus = cpus  # `taskset -c` form, e.g. "1": the server runs on these CPUs only
        self.app_model = app_model
        self.continuous_batching = continuous_batching
        self.cache_blocks = paged_cache_blocks(max_streams, max_tokens)
        self.max_batch_tokens = max_batch_tokens
        self.ready_timeout = ready_timeout
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log_path = Path(self._tmp.name) / "serve.log"
        self.model = ""
        self.command: list[str] = []
        self.process: subprocess.Popen[bytes] | None = None
        self.ready_after_s: float | None = None
        self.warm_up_s: float | None = None

    def __enter__(self) -> TransformersServe:
        self.model = str(prepared_model_dir(self.app_model))
        self.command = self._serve_command()
        try:
            self.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process:
            # Its HTTP server waits for open streams on SIGTERM; an upstream under test may have some.
            stop_process(self.process, grace_s=5)
        self._tmp.cleanup()

    def start(self) -> None:
        started = time.monotonic()
        self.process = subprocess.Popen(
            self.command, cwd=ROOT, stdout=self.log_path.open("ab"), stderr=subprocess.STDOUT
        )
        self._wait_healthy(started + self.ready_timeout)
        self.ready_after_s = time.monotonic() - started
        self.warm_up_s = self._warm_up()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _serve_command(self) -> list[str]:
        # The CLI's module run by this interpreter, so that the server has this venv's transformers.
        # Pinned from its start, so that torch sizes its thread pool to those CPUs.
        command = ["taskset", "-c", self.cpus] if self.cpus else []
        command += [sys.executable, "-m", "transformers.cli.transformers", "serve", self.model]
        command += ["--device", "cpu", "--dtype", "float32"]
        command += ["--host", "127.0.0.1", "--port", str(self.port)]
        if self.continuous_batching:
            command += ["--continuous-batching", "--cb-num-blocks", str(self.cache_blocks)]
            command += ["--cb-max-batch-tokens", str(self.max_batch_tokens)]
        return command

    def _wait_healthy(self, deadline: float) -> None:
        # It loads the model before it listens, so /health answers once it can generate.
        assert self.process is not None
        health = f"{self.base_url.removesuffix('/v1')}/health"
        wait_until_answering(self.process, health, deadline, name="transformers serve", log=self.log)

    def _warm_up(self) -> float:
        started = time.monotonic()
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 8,
            "temperature": 0,
        }
        response = httpx.post(f"{self.base_url}/chat/completions", json=body, timeout=self.ready_timeout)
        if response.status_code != 200:
            raise RuntimeError(f"warm-up request: HTTP {response.status_code} {response.text}\n{self.log()}")
        return time.monotonic() - started


class LlamaCppServer:
    """`with LlamaCppServer() as upstream:` starts llama-cpp-python's server on the packaged
    SmolLM2 GGUF and waits until it lists its model, served as `upstream.model`.

    Its `chatml-function-calling` chat format (SmolLM2's template is ChatML) takes `tools`:
    with a named `tool_choice` a grammar makes the answer that function's call, streamed as
    tool-call deltas, even from a model this small. `response_format` is a grammar too, and
    it reports `logprobs`. It runs one request at a time, and by default a new request (a
    health check of /v1/models included) ends the answer it is streaming, with a [DONE]:
    `--interrupt_requests false` makes it wait its turn instead.
    """

    model = "smollm2-gguf"

    def __init__(self, *, ready_timeout: float = 120) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="llama-cpp-server-")
        self.ready_timeout = ready_timeout
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log_path = Path(self._tmp.name) / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LlamaCppServer:
        gguf = assemble_gguf(resolve_model(APP_MODEL), Path(self._tmp.name))
        command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", self.model]
        command += ["--chat_format", "chatml-function-calling", "--n_ctx", "2048", "--verbose", "false"]
        command += ["--interrupt_requests", "false"]
        command += ["--host", "127.0.0.1", "--port", str(self.port)]
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=self.log_path.open("ab"), stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + self.ready_timeout
            wait_until_answering(
                self.process, f"{self.base_url}/models", deadline, name="llama_cpp.server", log=self.log
            )
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process:
            stop_process(self.process, grace_s=5)
        self._tmp.cleanup()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def endpoint(self, model: str = "smol-tools", **settings: object) -> dict[str, object]:
        """A CHAT_UPSTREAMS entry serving this server's model as `model`."""
        return {"model": model, "base_url": self.base_url, "upstream_model": self.model, **settings}


class SilentServer:
    """`with SilentServer() as upstream:` accepts connections on a free loopback port and
    reads what they send, but never answers, and keeps them open until it is closed."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.accepted = 0
        self.received = b""
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="silent-server", daemon=True)

    def __enter__(self) -> SilentServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._thread.join()

    def _serve(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            # A short timeout, so that the loop sees _stopping soon after it is set.
            while not self._stopping.is_set():
                for key, _ in selector.select(timeout=0.05):
                    sock: socket.socket = key.fileobj  # type: ignore[assignment]
                    if sock is self._listener:
                        connection, _ = sock.accept()
                        self.accepted += 1
                        selector.register(connection, selectors.EVENT_READ)
                    elif data := sock.recv(65536):
                        self.received += data
                    else:  # the client closed its end
                        selector.unregister(sock)
                        sock.close()
            for key in list(selector.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ScriptedServer:
    """`with ScriptedServer(handler) as upstream:` a real HTTP server (aiohttp's) on a free
    loopback port and a loop of its own, that lists one model, `m`, at /v1/models (or
    answers it with `models`) and answers every other request with `handler`, a coroutine
    that takes aiohttp's request.
    `loop` is the server's loop, for a test to set its handler's events from outside;
    `requests` the method, path and headers of each request it received; `peers` the
    client's address of each (one per connection), health checks' included."""

    def __init__(self, handler: Handler, *, models: Handler | None = None) -> None:
        self.handler = handler
        self.models = models or self._models
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.peers: list[object] = []
        self.loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self.loop.run_forever, name="scripted-server", daemon=True)

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()

    async def _start(self) -> None:
        app = web.Application(middlewares=[self._record])
        app.router.add_get("/v1/models", self.models)
        app.router.add_route("*", "/{path:.*}", self.handler)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _record(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.requests.append((request.method, request.path, dict(request.headers)))
        self.peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        return await handler(request)

    @staticmethod
    async def _models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})


def event_stream(chunks: list[dict[str, object]], *, done: bool = True) -> web.Response:
    """A whole OpenAI-style event stream of `chunks`, ended by `data: [DONE]` if `done`."""
    body = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + ("data: [DONE]\n\n" if done else "")
    return web.Response(body=body.encode(), content_type="text/event-stream")
