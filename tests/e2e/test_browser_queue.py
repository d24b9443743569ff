"""Waiting for room, in a real Chromium: one generation at a time, two may wait, the rest are refused.

Each person signs up in a browser context of their own. The synthetic model writes at a
slow, fixed rate, so an answer runs until its owner presses Stop.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.support.browser import FULL_ANSWER, sign_up, start_answer, stop, text_of, wait_for_words

QUEUE_ENV = {
    "CHAT_ENABLE_SYNTHETIC": "1",
    "CHAT_MODEL": "synthetic",
    "CHAT_SYNTHETIC_TOKENS_PER_S": "20",
    "GENERATION_MAX_CONCURRENT": "1",
    "GENERATION_MAX_QUEUE": "2",
}


@pytest.fixture(scope="module")
def queue_site(live_sites):
    return live_sites.site(QUEUE_ENV)


@pytest.fixture
def open_page(browser, queue_site):
    contexts = []

    def open_page():
        context = browser.new_context(base_url=queue_site.base_url)
        contexts.append(context)
        return context.new_page()

    yield open_page
    for context in contexts:
        context.close()


def test_waiting_answers_show_their_place_then_stream_in_turn(open_page):
    pages = [open_page() for _ in range(3)]
    first = start_answer(pages[0], "queue-first")
    wait_for_words(first, 2)

    second = start_answer(pages[1], "queue-second")
    expect(second.get_by_role("status")).to_have_text("Waiting — next in line")
    third = start_answer(pages[2], "queue-third")
    expect(third.get_by_role("status")).to_have_text("Waiting — 1 ahead")
    assert text_of(second) == text_of(third) == ""

    pages[2].reload()  # the status events are replayed: the place in the queue comes back
    third = pages[2].locator("article[data-role=assistant]").last
    expect(third.get_by_role("status")).to_have_text("Waiting — 1 ahead")

    stop(pages[0])
    expect(second.get_by_role("status")).to_have_count(0)  # running: the line is gone
    wait_for_words(second, 3)
    assert FULL_ANSWER.startswith(text_of(second))
    expect(third.get_by_role("status")).to_have_text("Waiting — next in line")

    stop(pages[1])
    expect(third.get_by_role("status")).to_have_count(0)
    wait_for_words(third, 3)
    assert FULL_ANSWER.startswith(text_of(third))
    stop(pages[2])


def test_a_full_queue_refuses_in_words_and_keeps_the_prompt(open_page):
    pages = [open_page() for _ in range(3)]
    first = start_answer(pages[0], "full-first")
    wait_for_words(first, 1)
    for page, name in ((pages[1], "full-second"), (pages[2], "full-third")):
        expect(start_answer(page, name).get_by_role("status")).to_contain_text("Waiting")

    late = open_page()
    sign_up(late, "full-fourth")
    late.get_by_label("Message").fill("One more, please")
    late.get_by_role("button", name="Send").click()

    expect(late.get_by_role("alert")).to_have_text("The server is busy right now. Try again in a moment.")
    expect(late.get_by_label("Message")).to_have_value("One more, please")
    expect(late.locator("article")).to_have_count(0)
    expect(late).to_have_url(re.compile(r"/chat/$"))  # no conversation was kept

    for page in pages:
        page.get_by_role("button", name="Stop").click()
    for page in pages:
        expect(page.locator("article[data-role=assistant]").last).to_have_attribute("data-status", "stopped")
