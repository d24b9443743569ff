from __future__ import annotations

import os
import shutil
import sys
import uuid
from asyncio import events as asyncio_events
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.test import Client, override_settings

from accounts import rate_limit
from accounts.alerts import alerts_wait
from accounts.models import DEFAULT_PLAN, Plan
from generation.backends import runtime
from guardrails.rule_cache import forget_rules
from inference.engine import Engine
from inference.generators import Generator, SyntheticGenerator, load_generator
from inference.registry import resolve_model
from inference.streams import InMemoryStreamStore
from infrastructure.database import close_connections
from tests.support import PASSWORD
from tests.support.engines import install_engine
from tests.support.livesite import STARTED, LiveSite
from tests.support.sites import LiveSites

E2E = Path(__file__).resolve().parent / "e2e"


def pytest_configure(config: pytest.Config) -> None:
    share_the_cores()


def share_the_cores() -> None:
    """Give each xdist worker's torch, and the processes its tests start, its share of the
    cores. With torch's default of one thread per core, two workers put four busy threads
    on two cores; OpenMP's waiting threads spin, and the real-model tests of
    tests/inference/test_batching.py and test_static_batch.py took 72 s instead of 50
    (`-n 2`, 2 cores). An OMP_NUM_THREADS already set is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return
    threads = max(1, (os.cpu_count() or 1) // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # read by torch as it loads, here or in a child
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tier marks that follow from where a test is and what it uses (pyproject.toml):
    tests/e2e/ starts processes; a test with Chromium is a browser test; one with the
    database or a live site can behave differently on PostgreSQL and Redis (`services`),
    but for the browser tests, whose sites use SQLite either way."""
    for item in items:
        if E2E in item.path.parents:
            item.add_marker(pytest.mark.e2e)
        if "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)
        elif item.get_closest_marker("django_db") or item.get_closest_marker("e2e"):
            item.add_marker(pytest.mark.services)
    heaviest_modules_first(items)


def heaviest_modules_first(items: list[pytest.Item]) -> None:
    """Order modules by how long they take, roughly: with `--dist loadfile` each worker
    takes the next module when it is free, so a heavy module collected last leaves the
    other worker idle while it runs. Browser and slow modules first, then the other e2e
    ones, then those with the real model, then the rest; within each, the usual order.
    (The whole suite's gain was not measured apart from that of the other speed-ups.)"""

    def weight(item: pytest.Item) -> int:
        if item.get_closest_marker("browser") or item.get_closest_marker("slow"):
            return 0
        if item.get_closest_marker("e2e"):
            return 1
        return 2 if "smollm" in getattr(item, "fixturenames", ()) else 3

    modules: dict[Path, int] = {}
    for item in items:
        modules[item.path] = min(modules.get(item.path, 3), weight(item))
    order = {path: index for index, path in enumerate(modules)}
    items.sort(key=lambda item: (modules[item.path], order[item.path]))


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix) -> None:
    """A test database of this run's own (pytest-django's hook): two runs on one machine,
    in one checkout or against one PostgreSQL, would otherwise share one and break each other."""
    database = django_settings.DATABASES["default"]
    test = database.setdefault("TEST", {})
    if database["ENGINE"].endswith("sqlite3"):
        test["NAME"] = f"{test['NAME']}-{os.getpid()}"
    else:
        test["NAME"] = f"{test.get('NAME') or 'test_' + database['NAME']}_{os.getpid()}"


@pytest.fixture(scope="session", autouse=True)
def _a_fast_password_hasher() -> Iterator[None]:
    """Django's advice for test suites: PBKDF2 costs about half a second per password on
    this kind of machine, paid for each user a test makes and each log-in. The live
    sites run with the real hashers (their own settings)."""
    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


@pytest.fixture(scope="session", autouse=True)
def _database_threads_close_their_connections(django_db_setup):
    # They keep their connections between tasks; the test database is dropped with none open.
    yield
    close_connections()


@pytest.fixture(autouse=True)
def _migrated_rows(request) -> None:
    # Tests with `transaction=True` end by flushing every table, the default plan that
    # migrate made included; with pytest-xdist a worker may run a module of such tests
    # before one that counts on the plan, so each database test starts with it.
    if request.node.get_closest_marker("django_db"):
        Plan.objects.get_or_create(name=DEFAULT_PLAN)


@pytest.fixture(autouse=True)
def _budget_alerts_sent_before_the_flush(request) -> Iterator[None]:
    # An admission past a soft limit hands an alert to the sender thread, which reads and
    # writes it on a connection of its own. A `transaction=True` test's flush (TRUNCATE)
    # racing that thread deadlocked in CI: the test ends only once the thread is idle.
    # (Autouse fixtures of plugins set up first, so this one's teardown precedes the flush.)
    yield
    if request.node.get_closest_marker("django_db"):
        assert alerts_wait(15), "the budget alert sender was still busy after 15 s"


@pytest.fixture(autouse=True)
def _no_event_loop_left_running(request) -> Iterator[None]:
    # A test that leaves an event loop marked running in the main thread makes every later
    # test on its worker fail with SynchronousOnlyOperation: name the culprit instead.
    # (The browser's is running on purpose until its module ends: see `browser`.)
    yield
    if "browser" not in request.fixturenames and asyncio_events._get_running_loop() is not None:
        asyncio_events._set_running_loop(None)
        pytest.fail("the test left an event loop running in the main thread")


@pytest.fixture(autouse=True)
def _plain_static_storage(settings):
    # The manifest storage needs collectstatic; tests render templates without it.
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    # WhiteNoise otherwise lists STATIC_ROOT as each test client loads the middleware, while
    # another worker's live site may be collecting into it (collectstatic deletes a file
    # before writing it again): a file gone between listing and stat failed a test.
    settings.WHITENOISE_AUTOREFRESH = True


@pytest.fixture(autouse=True)
def _no_titles_unless_asked(settings):
    # A title is one more generation after each first answer; tests that count
    # generations or queue places would see it. Title tests turn it back on.
    settings.CHAT_AUTO_TITLE = False


@pytest.fixture(autouse=True)
def _no_response_cache_unless_asked(settings):
    # Users of one test have the ids of another's (the database rolls back) while the
    # in-memory cache lives on, and tests that send a request twice expect two
    # generations: the response cache's tests turn it on, with a cache of their own.
    settings.CHAT_RESPONSE_CACHE = "off"


@pytest.fixture(autouse=True)
def _requests_counted_afresh(settings, monkeypatch):
    # Each test's users have the ids of earlier tests' users (the database rolls back), and
    # requests per minute are counted for 60 s by user id: start each test with none.
    monkeypatch.setattr(rate_limit, "local_log", rate_limit.LocalRequestLog())
    if settings.REDIS_URL:
        prefix = f"{settings.REDIS_KEY_PREFIX}-test-{uuid.uuid4().hex[:12]}"  # its keys expire in 60 s
        settings.CACHES = {"default": {**settings.CACHES["default"], "KEY_PREFIX": prefix}}


@pytest.fixture(autouse=True)
def _policy_rules_read_afresh() -> None:
    # Each process remembers the policy rules under a version in the cache; a test's rules
    # roll back with its database while the in-memory cache lives on.
    forget_rules()


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice", password=PASSWORD)


@pytest.fixture
def bob(django_user_model):
    return django_user_model.objects.create_user("bob", password=PASSWORD)


@pytest.fixture
def alice_client(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def bob_client(bob) -> Client:
    client = Client()
    client.force_login(bob)
    return client


@pytest.fixture
def stream_store() -> Iterator[InMemoryStreamStore]:
    """A runtime of this test's own: a fresh stream store, no engines, and a backend chosen
    again from this test's settings."""
    store = InMemoryStreamStore()
    previous = runtime.use(runtime.Runtime(store=store))
    yield store
    runtime.use(previous)


@pytest.fixture(scope="session")
def smollm() -> Generator:
    """The real packaged SmolLM2-135M-Instruct, loaded once per test session.

    In float32, where a batched row computes exactly what it would alone, so tests can
    compare texts. (The server's default on a CPU with bfloat16 arithmetic is bfloat16,
    whose rounding depends on the batch's shape: see test_batching.)"""
    spec = resolve_model("smollm2-135m-instruct")
    return load_generator(
        spec, cache_dir=django_settings.MODEL_CACHE_DIR, device="cpu", dtype="float32", synthetic_tokens_per_s=50
    )


@pytest.fixture
def real_engine(stream_store, smollm) -> Iterator[Engine]:
    engine = install_engine(stream_store, smollm)
    yield engine
    engine.stop(timeout=30)


@pytest.fixture
def fast_engine(stream_store) -> Iterator[Engine]:
    """A test double: the synthetic model at 500 words/s, through the same engine."""
    engine = install_engine(stream_store, SyntheticGenerator(tokens_per_s=500, answer_words=12))
    yield engine
    engine.stop(timeout=10)


@pytest.fixture(scope="session")
def live_sites() -> Iterator[LiveSites]:
    """Live sites by configuration, each started once for the run (tests.support.sites)."""
    sites = LiveSites()
    yield sites
    sites.close()


@pytest.fixture(scope="session")
def live_site(live_sites) -> LiveSite:
    """chatsite under a real daphne process with the real model, shared by the session."""
    return live_sites.site()


@pytest.fixture(scope="session")
def cache_site(live_sites) -> LiveSite:
    """chatsite under a real daphne with the real model and the response cache on (per user)."""
    return live_sites.site({"CHAT_RESPONSE_CACHE": "user"})


def pytest_sessionfinish(session) -> None:
    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:  # a pytest-xdist worker: its counts go to the controller
        worker_output["processes_started"] = dict(STARTED)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    STARTED.update(getattr(node, "workeroutput", {}).get("processes_started", {}))


def pytest_terminal_summary(terminalreporter) -> None:
    started = ", ".join(f"{count} {kind}" for kind, count in sorted(STARTED.items())) or "none"
    terminalreporter.write_line(f"processes started by the tests: {sum(STARTED.values())} ({started})")


CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium driven by Playwright (never a downloaded browser).

    Per module, not per run: Playwright's sync API keeps an event loop running in the main
    thread while it is open, and every database test on the same worker after it would
    fail with SynchronousOnlyOperation (a browser starts in about a second)."""
    if not shutil.which(CHROMIUM):
        if os.environ.get("CHATSITE_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium to run browser tests")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield browser
        browser.close()
