"""A chat answer from the response cache, in a real Chromium against the real model."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.support.browser import sign_up


@pytest.fixture
def page(browser, cache_site):
    context = browser.new_context(base_url=cache_site.base_url)
    page = context.new_page()
    yield page
    context.close()


def test_a_greedy_answer_regenerated_comes_from_cache_with_the_same_text_also_after_a_reload(page):
    sign_up(page, "browser-cache")
    page.get_by_label("Message").fill("Name a river in Europe.")
    page.get_by_role("button", name="Send").click()
    expect(page).to_have_url(re.compile(r"/chat/[0-9a-f-]{36}/$"))
    answers = page.locator("article[data-role=assistant]")
    expect(answers.last).to_have_attribute("data-status", "complete", timeout=180_000)

    page.locator("summary", has_text="Settings").click()
    page.get_by_label("Temperature").fill("0")
    page.get_by_label("Max tokens").fill("16")
    page.get_by_role("button", name="Save settings").click()
    expect(page.get_by_role("status")).to_contain_text("Saved.")

    # Greedy now: the first answer is generated and kept, the next one is the kept one.
    generated_answer = regenerate(page)
    generated = generated_answer.locator(".message-body").inner_text()
    assert generated.strip()
    expect(generated_answer.locator("[data-role=from-cache]")).to_have_count(0)

    cached_answer = regenerate(page)
    expect(cached_answer.locator("[data-role=from-cache]")).to_have_text("from cache")
    assert cached_answer.locator(".message-body").inner_text() == generated

    page.reload()
    reloaded = page.locator("article[data-role=assistant]").last
    expect(reloaded.locator("[data-role=from-cache]")).to_have_text("from cache")
    assert reloaded.locator(".message-body").inner_text() == generated


def regenerate(page):
    """Press Regenerate and wait for the new answer to complete in place of the old one."""
    old_id = page.locator("article[data-role=assistant]").last.get_attribute("id") or ""
    page.get_by_role("button", name="Regenerate").click()
    answer = page.locator("article[data-role=assistant]").last
    expect(answer).not_to_have_attribute("id", old_id)
    expect(answer).to_have_attribute("data-status", "complete", timeout=180_000)
    return answer
