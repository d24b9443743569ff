"""Fair waiting, in a real Chromium: another user's answer goes ahead of a user's second
one, and the answer it passes is told its new place on its page.

One generation at a time; the synthetic model writes slowly, so an answer runs until its
owner presses Stop.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.support.browser import start_answer, stop, wait_for_words

FAIR_ENV = {
    "CHAT_ENABLE_SYNTHETIC": "1",
    "CHAT_MODEL": "synthetic",
    "CHAT_SYNTHETIC_TOKENS_PER_S": "20",
    "GENERATION_MAX_CONCURRENT": "1",
    "GENERATION_MAX_QUEUE": "4",
}


@pytest.fixture(scope="module")
def fair_site(live_sites):
    return live_sites.site(FAIR_ENV)


def test_another_users_answer_goes_ahead_of_a_users_second_and_each_page_shows_its_place(browser, fair_site):
    contexts = [browser.new_context(base_url=fair_site.base_url) for _ in range(3)]
    try:
        holder = contexts[0].new_page()
        running = start_answer(holder, "fair-holder")
        wait_for_words(running, 1)

        alice = contexts[1].new_page()
        alices_first = start_answer(alice, "fair-alice")
        expect(alices_first.get_by_role("status")).to_have_text("Waiting — next in line")
        alice_again = contexts[1].new_page()  # the same person, a second chat in another tab
        alice_again.goto("/chat/")
        alice_again.get_by_label("Message").fill("And another long one")
        alice_again.get_by_role("button", name="Send").click()
        alices_second = alice_again.locator("article[data-role=assistant]").last
        expect(alices_second.get_by_role("status")).to_have_text("Waiting — 1 ahead")

        bob = contexts[2].new_page()
        bobs = start_answer(bob, "fair-bob")

        # Bob has had no turn yet: his one goes ahead of alice's second, which is told so.
        expect(bobs.get_by_role("status")).to_have_text("Waiting — 1 ahead")
        expect(alices_second.get_by_role("status")).to_have_text("Waiting — 2 ahead")
        expect(alices_first.get_by_role("status")).to_have_text("Waiting — next in line")

        stop(holder)
        expect(alices_first.get_by_role("status")).to_have_count(0)  # running
        expect(bobs.get_by_role("status")).to_have_text("Waiting — next in line")
        expect(alices_second.get_by_role("status")).to_have_text("Waiting — 1 ahead")

        stop(alice)
        expect(bobs.get_by_role("status")).to_have_count(0)
        wait_for_words(bobs, 1)
        expect(alices_second.get_by_role("status")).to_have_text("Waiting — next in line")
        stop(bob)
        stop(alice_again)
    finally:
        for context in contexts:
            context.close()
