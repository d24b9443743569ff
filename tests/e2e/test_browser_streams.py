"""Streams that survive, in a real Chromium: reloads, dropped connections, Stop, crashes.

These use the synthetic model (a fixed, known text at a fixed rate) so that every
sample of the page can be checked against the exact text it must be a prefix of.
"""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import expect

from tests.support.browser import FULL_ANSWER, start_answer, text_of, wait_for_words
from tests.support.tcp_proxy import FlakyProxy

RATE = 50
SYNTHETIC_ENV = {"CHAT_ENABLE_SYNTHETIC": "1", "CHAT_MODEL": "synthetic", "CHAT_SYNTHETIC_TOKENS_PER_S": str(RATE)}


@pytest.fixture(scope="module")
def synthetic_site(live_sites):
    return live_sites.site(SYNTHETIC_ENV)


@pytest.fixture
def proxy(synthetic_site):
    with FlakyProxy(synthetic_site.port) as flaky:
        yield flaky


@pytest.fixture
def page(browser, proxy):
    context = browser.new_context(base_url=f"http://127.0.0.1:{proxy.port}")
    page = context.new_page()
    yield page
    context.close()


def watch(answer, seconds: float) -> list[str]:
    """Sample the answer's text for a while; each sample must extend the one before."""
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        samples.append(text_of(answer))
        time.sleep(0.05)
    return samples


def assert_continuous(samples: list[str]) -> None:
    for sample in samples:
        assert FULL_ANSWER.startswith(sample), f"duplicated or missing text: {sample[-80:]!r}"
    assert samples == sorted(samples, key=len)


def test_reload_mid_answer_shows_the_text_so_far_and_continues_to_complete(page):
    answer = start_answer(page, "reloader")
    wait_for_words(answer, 40)
    before_reload = text_of(answer)

    page.reload()
    answer = page.locator("article[data-role=assistant]").last
    samples = watch(answer, 1.0)

    assert_continuous(samples)
    assert len(samples[-1]) > len(before_reload)  # the text so far came back, and grows
    expect(answer).to_have_attribute("data-status", "complete", timeout=30_000)
    assert text_of(answer) == FULL_ANSWER


def test_dropped_connection_resumes_without_duplicated_or_missing_text(page, proxy):
    answer = start_answer(page, "dropper")
    wait_for_words(answer, 30)

    proxy.drop()  # EventSource reconnects by itself, sending Last-Event-ID
    samples = watch(answer, 2.5)
    assert len(samples[-1].split()) > 30 + RATE  # it resumed and kept going
    assert_continuous(samples)

    # Now refuse reconnection for a moment: EventSource gives up (CLOSED) and the
    # SSE extension opens a new one, which must resume after the last event seen.
    proxy.refusing = True
    proxy.drop()
    time.sleep(1.5)
    proxy.refusing = False
    samples += watch(answer, 3.0)
    assert_continuous(samples)
    expect(answer).to_have_attribute("data-status", "complete", timeout=30_000)
    assert text_of(answer) == FULL_ANSWER


def test_stop_keeps_exactly_the_streamed_text_after_a_reload(page):
    answer = start_answer(page, "stopper")
    wait_for_words(answer, 20)

    page.get_by_role("button", name="Stop").click()

    expect(answer).to_have_attribute("data-status", "stopped", timeout=10_000)
    stopped_text = text_of(answer)
    assert FULL_ANSWER.startswith(stopped_text)
    assert len(stopped_text.split()) >= 20
    assert len(stopped_text) < len(FULL_ANSWER)
    page.reload()
    reloaded = page.locator("article[data-role=assistant]").last
    expect(reloaded).to_have_attribute("data-status", "stopped")
    assert text_of(reloaded) == stopped_text
    expect(page.get_by_role("button", name="Stop")).to_have_count(0)


def test_server_killed_mid_answer_leaves_it_interrupted_with_its_text_after_restart(browser, live_sites):
    with live_sites.own(SYNTHETIC_ENV) as site:
        context = browser.new_context(base_url=site.base_url)
        page = context.new_page()
        answer = start_answer(page, "crash")
        wait_for_words(answer, 3 * RATE)  # past at least one periodic save (every 2 s)

        site.kill()
        site.start()
        page.reload()

        answer = page.locator("article[data-role=assistant]").last
        expect(answer).to_have_attribute("data-status", "interrupted", timeout=20_000)
        saved = text_of(answer)
        assert FULL_ANSWER.startswith(saved)
        assert len(saved.split()) >= RATE
        context.close()
