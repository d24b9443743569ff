"""Run chatsite under daphne in a subprocess and talk to it like a browser does.

Shared by the end-to-end tests and the benchmarks: a real server on a free
loopback port with its own SQLite database, and a small HTTP client that signs
up, sends prompts the way the HTMX form does and reads the SSE stream.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Twisted listens with a backlog of 50: a burst of more connections than that overflows the
# kernel's accept queue, and clients see dropped connections. `make run`, the Dockerfile and
# docker-compose.yml start daphne with this backlog too.
LISTEN_BACKLOG = 4096


def daphne_endpoint(host: str, port: int) -> str:
    """daphne's `-e` endpoint string for a TCP port with a deep listen backlog."""
    return f"tcp:port={port}:interface={host}:backlog={LISTEN_BACKLOG}"


def stop_process(process: subprocess.Popen[bytes], grace_s: float = 15) -> None:
    """End a server politely (SIGTERM), and for good (SIGKILL) if it lingers."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            kill_process(process)


def kill_process(process: subprocess.Popen[bytes]) -> None:
    """End a process abruptly (SIGKILL), as a crash or the OOM killer would."""
    if process.poll() is None:
        process.kill()
        process.wait()


# Every process the tests start, by kind: the run's last line reports them (tests/conftest.py).
STARTED: Counter[str] = Counter()


def manage(root: Path, env: dict[str, str], *command: str) -> None:
    """`manage.py COMMAND` in a process of its own, as a deployment runs it."""
    STARTED["manage.py " + command[0]] += 1
    subprocess.run([sys.executable, "manage.py", *command], cwd=root, env=env, check=True)


class LiveSite:
    """`with LiveSite() as site:` starts migrate + daphne and waits for /readyz.

    `database_template`: an SQLite file migrated already, copied instead of migrating again;
    `static_root`: a folder static files were collected into already (tests.support.sites
    does both once per run). Without one the site collects into a folder of its own: a
    daphne lists its static files as it starts, and must not list them while another
    site's collectstatic rewrites them.
    """

    def __init__(
        self,
        env: dict[str, str] | None = None,
        ready_timeout: float = 180,
        root: Path = ROOT,
        *,
        database_template: Path | None = None,
        static_root: Path | None = None,
    ) -> None:
        # `root`: the checkout to serve, this one unless a bench compares another revision.
        self.root = root
        self.database_template = database_template
        self.static_collected = static_root is not None
        self._tmp = tempfile.TemporaryDirectory(prefix="chatsite-live-")
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "DATABASE_URL": f"sqlite:///{self._tmp.name}/db.sqlite3",
            "DJANGO_SECRET_KEY": "live-test-secret-key-not-for-production-use-0123456789",
            "PYTHONUNBUFFERED": "1",
            "STATIC_ROOT": str(static_root or Path(self._tmp.name) / "static"),
            # Its own Redis keys: users of its own database must not share rate-limit
            # counters (keyed by user id) with another database's users on the same Redis.
            "REDIS_KEY_PREFIX": f"chatsite-live-{uuid.uuid4().hex[:12]}",
            # No title generations after first answers, which would take batch rows and
            # queue places that tests and benchmarks count; those about titles turn it on.
            "CHAT_AUTO_TITLE": "0",
            # No answers from the response cache: tests that ask the same greedy question
            # twice mean to watch it generated twice; those about the cache turn it on.
            "CHAT_RESPONSE_CACHE": "off",
            # Stopped at a test's end: answers still running get 2 s, not 30, to finish.
            "GRACEFUL_TIMEOUT": "2",
            # Every test's users sign up from 127.0.0.1; the sign-up limit has tests of its own.
            "CHAT_SIGNUPS_PER_MINUTE": "1000",
            **(env or {}),
        }
        self.ready_timeout = ready_timeout
        self.ready_after_s: float | None = None
        self.log_path = Path(self._tmp.name) / "daphne.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LiveSite:
        database = self.env["DATABASE_URL"].removeprefix("sqlite:///")
        if self.database_template and database != self.env["DATABASE_URL"]:
            shutil.copyfile(self.database_template, database)
        else:
            manage(self.root, self.env, "migrate", "--noinput")
        if not self.static_collected:
            manage(self.root, self.env, "collectstatic", "--noinput", "--verbosity", "0")
        self.start()
        return self

    def start(self) -> None:
        started = time.monotonic()
        STARTED["daphne"] += 1
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "--access-log",  # as `make run`: chatsite's own request lines only
                "/dev/null",
                "-e",
                daphne_endpoint("127.0.0.1", self.port),
                "chatsite.asgi:application",
            ],
            cwd=self.root,
            env=self.env,
            stdout=self.log_path.open("ab"),
            stderr=subprocess.STDOUT,
        )
        try:
            self.ready_after_s = self._wait_ready(started)
        except BaseException:  # `with` never reaches __exit__: a daphne left busy would slow all that follows
            self.stop()
            raise

    def kill(self) -> None:
        """End daphne abruptly (SIGKILL), as a crash or an OOM kill would."""
        if self.process:
            kill_process(self.process)

    def stop(self) -> None:
        if self.process:
            stop_process(self.process)

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._tmp.cleanup()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _wait_ready(self, started: float) -> float:
        deadline = started + self.ready_timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"daphne exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.base_url}/readyz", timeout=2).status_code == 200:
                    return time.monotonic() - started
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"/readyz not 200 after {self.ready_timeout} s:\n{self.log()}")


class LiveWorker:
    """A Celery worker in a subprocess, with the environment of the sites it serves.

    `queue="generation"` is a model worker (it loads CHAT_MODEL); `queue="housekeeping"`
    with `beat=True` is the scheduler with its housekeeping worker (docs/scaling.md).
    """

    def __init__(self, env: dict[str, str], *, queue: str = "generation", beat: bool = False) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix=f"chatsite-{queue}-")
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
        self.queue = queue
        self.beat = beat
        self.log_path = Path(self._tmp.name) / "worker.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LiveWorker:
        self.start()
        return self

    def start(self, ready_timeout: float = 120) -> None:
        command = [sys.executable, "-m", "celery", "-A", "chatsite", "worker", "-Q", self.queue, "-P", "threads"]
        command += ["-n", f"{self.queue}-{uuid.uuid4().hex[:8]}@%h", "--loglevel", "INFO", "--without-mingle"]
        if self.beat:
            command += ["-B", "-s", f"{self._tmp.name}/beat-schedule", "-c", "2"]
        started = time.monotonic()
        # A model worker says so once its engine has loaded and it took its place; a
        # restarted one says it again in the same log.
        ready_line = "serves" if self.queue == "generation" else " ready."
        said_before = self.log().count(ready_line)
        STARTED["celery worker"] += 1
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=self.env, stdout=self.log_path.open("ab"), stderr=subprocess.STDOUT
        )
        while self.log().count(ready_line) <= said_before:
            if self.process.poll() is not None:
                raise RuntimeError(f"celery worker exited with {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > started + ready_timeout:
                raise TimeoutError(f"celery worker not ready after {ready_timeout} s:\n{self.log()}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL, as the OOM killer would."""
        if self.process:
            kill_process(self.process)

    def stop(self) -> None:
        if self.process:
            stop_process(self.process, grace_s=5)

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._tmp.cleanup()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextmanager
def scratch_database() -> Iterator[str]:
    """A database URL of its own for live processes: PostgreSQL when DATABASE_URL names
    one (a new database beside it, dropped afterwards), else an SQLite file."""
    configured = os.environ.get("DATABASE_URL", "")
    if not configured.startswith("postgres"):
        with tempfile.TemporaryDirectory(prefix="chatsite-db-") as folder:
            yield f"sqlite:///{folder}/db.sqlite3"
        return
    import psycopg

    name = f"chatsite_live_{uuid.uuid4().hex[:12]}"
    base, _, _ = configured.rpartition("/")
    with psycopg.connect(configured, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(configured, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def scratch_redis_prefix(url: str, name: str = "chatsite-bench") -> Iterator[str]:
    """A REDIS_KEY_PREFIX of its own on the Redis at `url`; its keys are deleted afterwards.

    Every key of a deployment is under it, Celery's queues included (the broker's
    `global_keyprefix`), so deployments sharing a Redis never take each other's tasks.
    """
    import redis

    prefix = f"{name}-{uuid.uuid4().hex[:12]}"
    try:
        yield prefix
    finally:
        client = redis.Redis.from_url(url)
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            client.delete(key)
        client.close()


_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
_LEVELS = re.compile(r"^\[[^]]*\b(ERROR|CRITICAL)/[^]]*\] ")  # Celery's format


def log_errors(log: str) -> dict[str, Any]:
    """What went wrong in a server's log: its tracebacks, and each distinct error with its count.

    An error is the exception that ends a traceback (a chain of them counts once, by its
    last), or a line that Celery logged at ERROR or CRITICAL, without its timestamp.
    """
    errors: Counter[str] = Counter()
    tracebacks = 0
    pending: str | None = None  # a traceback's exception, unless a chained traceback follows
    in_traceback = False
    for line in log.splitlines():
        if line.startswith("Traceback (most recent call last):"):
            in_traceback, pending = True, None
        elif in_traceback:
            if line and not line[0].isspace():
                in_traceback, pending = False, line[:300]
        elif pending is not None and line and not line.startswith(_CHAINED):
            errors[pending] += 1
            tracebacks += 1
            pending = None
        if not in_traceback and (found := _LEVELS.match(line)):
            errors[f"{found.group(1)}: {line[found.end() :]}"[:300]] += 1
    if pending is not None:
        errors[pending] += 1
        tracebacks += 1
    return {"tracebacks": tracebacks, "errors": dict(errors.most_common(10))}


def keep_logs(folder: Path | None, logs: dict[str, Path]) -> None:
    """Copy servers' logs (name -> log path) into `folder`, if given, before they are cleaned up."""
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    for name, path in logs.items():
        shutil.copyfile(path, folder / f"{name}.log")


@dataclass
class StreamEvent:
    at: float
    event: str
    data: str
    id: str | None = None


@dataclass
class Sent:
    sent_at: float
    stream_url: str
    conversation_url: str
    html: str = field(repr=False)


class ChatClient:
    """A browser-like session: cookies, CSRF header, HTMX posts, SSE reads."""

    def __init__(self, base_url: str) -> None:
        self.http = httpx.Client(base_url=base_url, timeout=120, follow_redirects=False)

    def signup(self, username: str, password: str = "correct-horse-battery-staple") -> None:
        page = self.http.get("/accounts/signup/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token, "signup page has no CSRF token"
        response = self.http.post(
            "/accounts/signup/",
            data={
                "csrfmiddlewaretoken": token.group(1),
                "username": username,
                "password1": password,
                "password2": password,
            },
        )
        assert response.status_code == 302, response.text

    def same_session_on(self, base_url: str) -> ChatClient:
        """A client of another web process, signed in as this one (sessions are in the database)."""
        other = ChatClient(base_url)
        other.http.cookies = self.http.cookies
        return other

    def htmx_post(self, url: str, data: dict[str, str] | None = None) -> httpx.Response:
        """POST as the page's HTMX does: with its header and the CSRF token."""
        return self.http.post(
            url, data=data or {}, headers={"HX-Request": "true", "X-CSRFToken": self.http.cookies["csrftoken"]}
        )

    def stop(self, sent_html: str) -> httpx.Response:
        """Press Stop on the answer that `send` returned."""
        return self.htmx_post(f"/chat/messages/{self.answer_id(sent_html)}/stop/")

    @staticmethod
    def answer_id(sent_html: str) -> str:
        found = re.search(r'id="message-(\d+)" class="message message--assistant"', sent_html)
        assert found, sent_html
        return found.group(1)

    def send(self, prompt: str, conversation_url: str = "/chat/") -> Sent:
        sent_at = time.perf_counter()
        response = self.htmx_post(conversation_url, {"prompt": prompt})
        assert response.status_code == 200, response.text
        stream_url = re.search(r'sse-connect="([^"]+)"', response.text)
        assert stream_url, response.text
        return Sent(sent_at, stream_url.group(1), response.headers.get("HX-Push-Url", conversation_url), response.text)

    def stream(self, stream_url: str, headers: dict[str, str] | None = None) -> Iterator[StreamEvent]:
        """Yield SSE events as they arrive, stamped with time.perf_counter()."""
        with self.http.stream("GET", stream_url, headers=headers or {}) as response:
            response.raise_for_status()
            fields: dict[str, str] = {}
            data: list[str] = []
            for line in response.iter_lines():
                if line == "":
                    if data:
                        yield StreamEvent(
                            time.perf_counter(), fields.get("event", "message"), "\n".join(data), fields.get("id")
                        )
                    fields, data = {}, []
                    continue
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "data":
                    data.append(value)
                elif name in ("event", "id"):
                    fields[name] = value

    @staticmethod
    def delta(event: StreamEvent) -> str:
        return json.loads(event.data)["delta"]


def user_with_api_key(site: LiveSite, username: str) -> str:
    """Sign `username` up on `site` through its pages, and make them an API key (manage.py)."""
    ChatClient(site.base_url).signup(username)
    STARTED["manage.py create_api_key"] += 1
    done = subprocess.run(
        [sys.executable, "manage.py", "create_api_key", username, "--name", "tests"],
        cwd=site.root,
        env=site.env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


ACCOUNT_WITH_LIMITS = """
import json, os, uuid
from django.contrib.auth import get_user_model
from accounts.models import Account
from accounts.services import account_for, api_key_create
user = get_user_model().objects.create_user("load-" + uuid.uuid4().hex[:8])
Account.objects.filter(pk=account_for(user).pk).update(**json.loads(os.environ["ACCOUNT_LIMITS"]))
print(api_key_create(user=user, name="load")[1])
"""
UNLIMITED = {
    "requests_per_minute": 10**9,
    "tokens_per_day": 10**9,
    "max_concurrent_streams": 10**9,
    "max_tokens_per_request": 10**9,
}


def unlimited_api_key(site: LiveSite, **limits: object) -> str:
    """An API key of a new user on `site` whose plan lets any load through (tests, benches),
    but for the `limits` given (Account fields: tokens_per_day=100, say)."""
    STARTED["manage.py shell"] += 1
    output = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", ACCOUNT_WITH_LIMITS],
        cwd=site.root,
        env={**site.env, "ACCOUNT_LIMITS": json.dumps({**UNLIMITED, **limits})},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return output.strip().splitlines()[-1]


T = TypeVar("T")


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    """asyncio.run() on a thread of its own: once a browser test has run, Playwright keeps an
    event loop running in the main thread for the rest of the session."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, coroutine).result()
