"""The chat in a real Chromium: htmx posts, the SSE extension and chat.js."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import expect

from tests.support.browser import sign_up


@pytest.fixture
def page(browser, live_site):
    context = browser.new_context(base_url=live_site.base_url)
    page = context.new_page()
    yield page
    context.close()


def test_answer_grows_token_by_token_then_completes_and_survives_a_reload(page):
    sign_up(page, "browser-alice")
    page.get_by_label("Message").fill("Tell me a short story about a lighthouse keeper.")
    page.get_by_role("button", name="Send").click()

    answer = page.locator("article[data-role=assistant]").last
    expect(page.locator("article[data-role=user]")).to_contain_text("lighthouse keeper")
    lengths = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and answer.get_attribute("data-status") in (None, "streaming"):
        lengths.append(len(answer.locator(".message-body").inner_text()))
        time.sleep(0.1)
    expect(answer).to_have_attribute("data-status", "complete", timeout=180_000)
    growing = sorted(set(length for length in lengths if length))
    assert len(growing) >= 3, f"the answer did not grow in steps: {lengths}"
    assert lengths == sorted(lengths)

    expect(page).to_have_url(re.compile(r"/chat/[0-9a-f-]{36}/$"))
    final_text = answer.locator(".message-body").inner_text()
    assert final_text.strip()
    page.reload()
    reloaded = page.locator("article[data-role=assistant]").last
    expect(reloaded).to_have_attribute("data-status", "complete")
    assert reloaded.locator(".message-body").inner_text() == final_text
    expect(page.get_by_role("link", name="New chat")).to_be_visible()


def test_enter_sends_and_focus_returns_to_the_message_box(page):
    sign_up(page, "browser-bob")
    box = page.get_by_label("Message")
    box.fill("Say hi")
    box.press("Enter")
    expect(page.locator("article[data-role=assistant]")).to_have_attribute("data-status", "complete", timeout=180_000)
    expect(page.get_by_label("Message")).to_be_focused()
    expect(page.get_by_label("Message")).to_have_value("")

    # The next prompt goes to the same conversation, whose URL the page now shows.
    conversation_url = page.url
    page.get_by_label("Message").fill("And bye")
    page.get_by_role("button", name="Send").click()
    expect(page.locator("article[data-role=user]")).to_have_count(2)
    expect(page.locator("article[data-role=assistant]").nth(1)).to_have_attribute(
        "data-status", "complete", timeout=180_000
    )
    assert page.url == conversation_url
    expect(page.locator("#conversations a")).to_have_count(1)
