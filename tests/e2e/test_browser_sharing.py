"""Share links in a real Chromium: Share, the snapshot opened in fresh browser contexts
(another user; a visitor, per CHAT_SHARING), later edits, Continue this chat, revoking."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.e2e.test_browser_ui import SYNTHETIC_ENV, ask_and_stop
from tests.support.browser import sign_up

PROBE = '<img src=x onerror="window.pwned=1"> Which tea?'


@pytest.fixture(scope="module")
def users_site(live_sites):
    return live_sites.site(SYNTHETIC_ENV)  # CHAT_SHARING's default: users


@pytest.fixture(scope="module")
def public_site(live_sites):
    return live_sites.site({**SYNTHETIC_ENV, "CHAT_SHARING": "public"})


def context_on(browser, site, **options):
    return browser.new_context(base_url=site.base_url, **options)


def shared_by(page, username: str) -> str:
    """Sign up, ask the probe, press Share; the link's address."""
    sign_up(page, username)
    ask_and_stop(page, PROBE)
    page.get_by_role("button", name="Share").click()
    link = page.locator("[data-role=share-url]")
    expect(link).to_have_value(re.compile(r"^http://[^/]+/s/[A-Za-z0-9_-]{32}/$"))
    return link.input_value()


def test_a_shared_snapshot_reads_for_another_user_stays_as_shared_and_continues(browser, users_site):
    owner_context = context_on(browser, users_site)
    owner = owner_context.new_page()
    url = shared_by(owner, "share-owner")
    visitor_context, reader_context = context_on(browser, users_site), context_on(browser, users_site)
    try:
        visitor = visitor_context.new_page()
        visitor.goto(url)
        expect(visitor).to_have_url(re.compile(r"/accounts/login/\?next=/s/"))

        reader = reader_context.new_page()
        sign_up(reader, "share-reader")
        reader.goto(url)
        expect(reader.locator("article[data-role=user]")).to_have_text(PROBE)  # as text, not HTML
        expect(reader.locator("article[data-role=assistant]")).to_have_count(1)
        assert reader.evaluate("window.pwned") is None

        owner.get_by_label("Message").fill("A later question")
        owner.get_by_role("button", name="Send").click()
        expect(owner.locator("article[data-role=user]")).to_have_count(2)
        reader.reload()
        expect(reader.locator("article[data-role=user]")).to_have_count(1)  # the snapshot as it was

        reader.get_by_role("button", name="Continue this chat").click()
        expect(reader).to_have_url(re.compile(r"/chat/[0-9a-f-]{36}/$"))
        expect(reader.locator("article[data-role=user] .message-body")).to_have_text(PROBE)
        expect(reader.get_by_label("Message")).to_be_editable()

        owner.goto("/chat/data/")
        owner.get_by_role("button", name=re.compile("^Revoke")).click()
        expect(owner.get_by_text("You have not shared any conversation.")).to_be_visible()
        assert reader.goto(url).status == 404
        assert reader.goto(re.sub(r"/s/[^/]+/", "/s/" + "A" * 32 + "/", url)).status == 404
        assert reader.goto(url.replace("/s/", "/s/..%2F")).status == 404
    finally:
        for context in (owner_context, visitor_context, reader_context):
            context.close()


def test_with_public_sharing_a_visitor_reads_it_even_without_javascript(browser, public_site):
    owner_context = context_on(browser, public_site)
    owner = owner_context.new_page()
    url = shared_by(owner, "public-owner")
    visitor_context = context_on(browser, public_site, java_script_enabled=False)
    try:
        visitor = visitor_context.new_page()
        assert visitor.goto(url).status == 200
        expect(visitor.locator("article[data-role=user]")).to_have_text(PROBE)
        expect(visitor.locator("article[data-role=assistant] .message-body")).not_to_be_empty()
        expect(visitor.get_by_role("link", name="Log in to continue this chat")).to_be_visible()

        owner.get_by_role("button", name="Stop sharing").click()
        expect(owner.locator("[data-role=share-url]")).to_have_count(0)
        assert visitor.goto(url).status == 404
    finally:
        owner_context.close()
        visitor_context.close()
