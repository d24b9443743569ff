"""Rating an answer in a real Chromium: 👍 / 👎, a reason and a comment, kept across a reload."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.e2e.test_browser_ui import SYNTHETIC_ENV  # slow enough for a Stop to come in time
from tests.support.browser import sign_up


@pytest.fixture(scope="module")
def synthetic_site(live_sites):
    return live_sites.site(SYNTHETIC_ENV)


@pytest.fixture
def page(browser, synthetic_site):
    context = browser.new_context(base_url=synthetic_site.base_url)
    page = context.new_page()
    yield page
    context.close()


def test_a_rating_with_its_reason_and_comment_survives_a_reload_and_can_be_changed(page):
    sign_up(page, "ui-rater")
    page.get_by_label("Message").fill("Rate this")
    page.get_by_role("button", name="Send").click()
    expect(page).to_have_url(re.compile(r"/chat/[0-9a-f-]{36}/$"))
    answer = page.locator("article[data-role=assistant]").last
    expect(answer.locator(".message-body")).not_to_be_empty()
    expect(answer.get_by_role("button", name="Good answer", exact=True)).to_have_count(0)  # not while it streams
    page.get_by_role("button", name="Stop").click()
    expect(answer).to_have_attribute("data-status", "stopped", timeout=10_000)

    answer.get_by_role("button", name="Bad answer", exact=True).click()
    expect(answer.get_by_role("button", name="Bad answer", exact=True)).to_have_attribute("aria-pressed", "true")
    expect(answer.get_by_role("button", name="Good answer", exact=True)).to_have_attribute("aria-pressed", "false")
    answer.locator("summary", has_text="Add a reason or comment").click()
    answer.get_by_label("Reason").select_option(label="Incomplete")
    answer.get_by_label("Comment").fill("It stopped halfway.")
    answer.get_by_role("button", name="Save").click()
    expect(answer.get_by_role("status")).to_have_text("Thanks: your rating is saved.")

    page.reload()
    answer = page.locator("article[data-role=assistant]").last
    expect(answer.get_by_role("button", name="Bad answer", exact=True)).to_have_attribute("aria-pressed", "true")
    answer.locator("summary", has_text="Your reason and comment").click()
    expect(answer.get_by_label("Comment")).to_have_value("It stopped halfway.")

    # Changed from the keyboard: the reason and comment stay.
    answer.get_by_role("button", name="Good answer", exact=True).focus()
    page.keyboard.press("Enter")
    expect(answer.get_by_role("button", name="Good answer", exact=True)).to_have_attribute("aria-pressed", "true")
    page.reload()
    answer = page.locator("article[data-role=assistant]").last
    expect(answer.get_by_role("button", name="Good answer", exact=True)).to_have_attribute("aria-pressed", "true")
    expect(answer.get_by_role("button", name="Bad answer", exact=True)).to_have_attribute("aria-pressed", "false")
    expect(answer.get_by_label("Comment")).to_have_value("It stopped halfway.")
