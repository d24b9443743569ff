"""The guest sandbox in a real Chromium: try the chat without an account, then keep it by
signing up or by logging in to an account one has."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from tests.support import PASSWORD
from tests.support.livesite import ChatClient

GUEST_ENV = {
    "CHAT_ENABLE_SYNTHETIC": "1",
    "CHAT_MODEL": "synthetic",
    "CHAT_SYNTHETIC_TOKENS_PER_S": "200",
    "CHAT_GUEST": "on",
}


@pytest.fixture(scope="module")
def guest_site(live_sites):
    return live_sites.site(GUEST_ENV)


@pytest.fixture
def page(browser, guest_site):
    context = browser.new_context(base_url=guest_site.base_url)
    page = context.new_page()
    yield page
    context.close()


def test_a_guest_chats_then_signs_up_and_keeps_the_conversation(page):
    page.goto("/accounts/login/")
    page.get_by_role("button", name="Try it without an account", exact=True).click()
    expect(page).to_have_url(re.compile(r"/chat/$"))

    page.get_by_label("Message").fill("Tell me about lighthouses")
    page.get_by_role("button", name="Send").click()
    expect(page).to_have_url(re.compile(r"/chat/[0-9a-f-]{36}/$"))
    conversation_url = page.url
    expect(page.locator("article[data-role=assistant]").last).to_have_attribute(
        "data-status", "complete", timeout=30_000
    )
    answer = page.locator("article[data-role=assistant] .message-body").last.text_content()
    assert answer and answer.strip()

    page.get_by_role("link", name="Sign up to keep this chat", exact=True).click()
    page.fill("[name=username]", "kept-guest")
    page.fill("[name=password1]", PASSWORD)
    page.fill("[name=password2]", PASSWORD)
    page.get_by_role("button", name="Sign up").click()
    expect(page).to_have_url(re.compile(r"/chat/$"))

    expect(page.get_by_role("navigation", name="Account")).to_contain_text("kept-guest")
    expect(page.get_by_role("link", name="Sign up to keep this chat", exact=True)).to_have_count(0)
    page.goto(conversation_url)
    expect(page.locator("article[data-role=user]")).to_have_count(1)
    expect(page.locator("article[data-role=user]")).to_contain_text("Tell me about lighthouses")
    kept = page.locator("article[data-role=assistant]")
    expect(kept).to_have_count(1)
    expect(kept).to_have_attribute("data-status", "complete")
    expect(kept.locator(".message-body")).to_contain_text(" ".join(answer.split()[:8]))


def test_a_guest_chats_then_logs_in_to_an_account_and_finds_the_conversation_in_the_sidebar(page, guest_site):
    ChatClient(guest_site.base_url).signup("has-an-account", PASSWORD)
    page.goto("/accounts/login/")
    page.get_by_role("button", name="Try it without an account", exact=True).click()
    page.get_by_label("Message").fill("Tell me about harbours")
    page.get_by_role("button", name="Send").click()
    expect(page).to_have_url(re.compile(r"/chat/[0-9a-f-]{36}/$"))
    conversation_path = urlsplit(page.url).path
    expect(page.locator("article[data-role=assistant]").last).to_have_attribute(
        "data-status", "complete", timeout=30_000
    )

    page.get_by_role("link", name="Sign up to keep this chat", exact=True).click()
    page.get_by_role("link", name="Log in", exact=True).click()
    page.fill("[name=username]", "has-an-account")
    page.fill("[name=password]", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(re.compile(r"/chat/$"))

    expect(page.get_by_role("navigation", name="Account")).to_contain_text("has-an-account")
    kept = page.locator(f'#conversations li a[href="{conversation_path}"]')
    expect(kept).to_have_count(1)
    kept.click()
    expect(page.locator("article[data-role=user]")).to_contain_text("Tell me about harbours")
    expect(page.locator("article[data-role=assistant]")).to_have_attribute("data-status", "complete")
