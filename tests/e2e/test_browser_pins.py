"""Pins and the archive in a real Chromium, with two browser contexts of one user (two
devices): what one pins, archives or restores, the other shows on its next load."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.e2e.test_browser_ui import SYNTHETIC_ENV, ask_and_stop, log_in
from tests.support.browser import sign_up


@pytest.fixture(scope="module")
def synthetic_site(live_sites):
    return live_sites.site(SYNTHETIC_ENV)


def test_pins_and_the_archive_follow_the_user_to_another_browser(browser, synthetic_site):
    laptop_context = browser.new_context(base_url=synthetic_site.base_url)
    phone_context = browser.new_context(base_url=synthetic_site.base_url)
    try:
        laptop = laptop_context.new_page()
        sign_up(laptop, "pin-keeper")
        ask_and_stop(laptop, "Plan a trip")
        laptop.goto("/chat/")
        ask_and_stop(laptop, "Pack a bag")
        sidebar = laptop.locator("#conversations li a")
        expect(sidebar).to_have_text(["Pack a bag", "Plan a trip"])

        # Pin the older one from the keyboard: the new button keeps the focus.
        laptop.get_by_role("link", name="Plan a trip").click()
        laptop.get_by_role("button", name="Pin", exact=True).focus()
        laptop.keyboard.press("Enter")
        expect(laptop.get_by_role("button", name="Unpin")).to_be_focused()
        expect(sidebar.first).to_have_text(re.compile(r"Pinned: Plan a trip$"))

        phone = phone_context.new_page()
        phone.goto("/accounts/login/")
        log_in(phone, "pin-keeper")
        expect(phone).to_have_url(re.compile(r"/chat/$"))
        phone_sidebar = phone.locator("#conversations li a")
        expect(phone_sidebar).to_have_count(2)
        expect(phone_sidebar.first).to_have_text(re.compile(r"Pinned: Plan a trip$"))
        expect(phone_sidebar.first.locator(".pin-mark")).to_be_visible()

        # Archive it on the laptop: it leaves the sidebar and stays open, marked archived.
        laptop.get_by_role("button", name="Archive", exact=True).click()
        expect(laptop.get_by_role("button", name="Unarchive")).to_be_visible()
        expect(laptop.get_by_text(re.compile(r"^Archived .*: not in the sidebar$"))).to_be_visible()
        expect(sidebar).to_have_text(["Pack a bag"])
        expect(laptop.locator("article[data-role=user]")).to_contain_text("Plan a trip")

        phone.reload()
        expect(phone_sidebar).to_have_text(["Pack a bag"])
        phone.get_by_role("link", name="Archived", exact=True).click()
        expect(phone).to_have_url(re.compile(r"/chat/archived/$"))
        expect(phone.get_by_role("link", name="Plan a trip")).to_be_visible()

        # Restore it from the phone's Archived page.
        phone.get_by_role("button", name="Unarchive Plan a trip").click()
        expect(phone.get_by_role("status")).to_have_text(re.compile(r"Plan a trip\s+is back in the sidebar\."))
        phone.reload()
        expect(phone.get_by_text("No archived conversations.")).to_be_visible()

        laptop.reload()
        expect(sidebar).to_have_text(["Pack a bag", "Plan a trip"])  # back in its place, unpinned
        expect(laptop.get_by_role("button", name="Pin", exact=True)).to_be_visible()
    finally:
        laptop_context.close()
        phone_context.close()
