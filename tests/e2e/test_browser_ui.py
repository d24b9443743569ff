"""Living with the chat in a real Chromium: rename, delete, Regenerate, Edit, settings, quota, phones.

The synthetic model (a fixed text at 40 words/s) keeps the answers quick and countable.
At that speed a whole answer (512 words) takes 13 s, the time a Stop has to arrive: at
100 words/s a CI machine busy with the other test worker once took longer than the 5 s
left, and the answer was complete before the Stop came.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.support import PASSWORD
from tests.support.browser import sign_up

SYNTHETIC_ENV = {"CHAT_ENABLE_SYNTHETIC": "1", "CHAT_MODEL": "synthetic", "CHAT_SYNTHETIC_TOKENS_PER_S": "40"}


@pytest.fixture(scope="module")
def synthetic_site(live_sites):
    return live_sites.site(SYNTHETIC_ENV)


@pytest.fixture
def page(browser, synthetic_site):
    context = browser.new_context(base_url=synthetic_site.base_url)
    page = context.new_page()
    yield page
    context.close()


def ask_and_stop(page, prompt: str):
    """Send a prompt and stop its answer after a few words; returns the answer."""
    page.get_by_label("Message").fill(prompt)
    page.get_by_role("button", name="Send").click()
    expect(page).to_have_url(re.compile(r"/chat/[0-9a-f-]{36}/$"))
    answer = page.locator("article[data-role=assistant]").last
    expect(answer.locator(".message-body")).not_to_be_empty()
    page.get_by_role("button", name="Stop").click()
    expect(answer).to_have_attribute("data-status", "stopped", timeout=10_000)
    return answer


def test_rename_shows_the_new_title_in_the_header_and_the_sidebar(page):
    sign_up(page, "ui-renamer")
    ask_and_stop(page, "Plan a trip")
    expect(page.locator("#conversations a")).to_have_text("Plan a trip")

    page.locator("summary", has_text="Rename").click()
    page.get_by_label("Title").fill("Lisbon in May")
    page.get_by_role("button", name="Save title").click()

    expect(page.get_by_role("heading", name="Lisbon in May")).to_be_visible()
    expect(page.locator("#conversations a")).to_have_text("Lisbon in May")
    expect(page).to_have_title("Lisbon in May · chatsite")
    page.reload()
    expect(page.locator("#conversations a")).to_have_text("Lisbon in May")


def test_rename_to_an_empty_title_says_what_is_wrong(page):
    sign_up(page, "ui-blank-title")
    ask_and_stop(page, "Keep this title")

    page.locator("summary", has_text="Rename").click()
    page.get_by_label("Title").fill("")
    page.get_by_role("button", name="Save title").click()

    expect(page.get_by_role("alert")).to_have_text("Give the conversation a title.")
    expect(page.locator("#conversations a")).to_have_text("Keep this title")


def test_delete_after_confirming_removes_it_and_lands_on_a_new_chat(page):
    sign_up(page, "ui-deleter")
    ask_and_stop(page, "Something to forget")

    page.locator("summary", has_text="Delete…").click()
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Delete conversation").click()

    expect(page).to_have_url(re.compile(r"/chat/$"))
    expect(page.locator("#conversations a")).to_have_count(0)
    expect(page.get_by_text("Your conversations will appear here.")).to_be_visible()


def test_dismissing_the_delete_confirmation_keeps_the_conversation(page):
    sign_up(page, "ui-hesitant")
    ask_and_stop(page, "Maybe keep me")
    url = page.url

    page.locator("summary", has_text="Delete…").click()
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.get_by_role("button", name="Delete conversation").click()

    page.reload()
    assert page.url == url
    expect(page.locator("#conversations a")).to_have_text("Maybe keep me")


def test_regenerate_streams_a_new_answer_to_complete_in_place_of_the_old_one(page):
    sign_up(page, "ui-regenerator")
    old = ask_and_stop(page, "Say something")
    old_id = old.get_attribute("id")

    page.get_by_role("button", name="Regenerate").click()

    answers = page.locator("article[data-role=assistant]")
    expect(answers).to_have_count(1)
    new = answers.first
    expect(new).not_to_have_attribute("id", old_id or "")
    expect(new).to_have_attribute("data-status", "streaming")
    expect(new).to_have_attribute("data-status", "complete", timeout=60_000)
    expect(new.locator(".message-meta")).to_contain_text("512 tokens")
    expect(page.get_by_role("button", name="Regenerate")).to_have_count(1)


def test_edit_the_last_prompt_and_get_a_new_answer(page):
    sign_up(page, "ui-editor")
    ask_and_stop(page, "Waht is the time?")

    page.locator("article[data-role=user] summary", has_text="Edit").click()
    page.get_by_label("Your prompt").fill("What is the time?")
    page.get_by_role("button", name="Save and ask again").click()

    expect(page.locator("article[data-role=user] .message-body")).to_have_text("What is the time?")
    answers = page.locator("article[data-role=assistant]")
    expect(answers).to_have_count(1)
    expect(answers.first).to_have_attribute("data-status", "streaming")
    page.get_by_role("button", name="Stop").click()
    expect(answers.first).to_have_attribute("data-status", "stopped", timeout=10_000)


def test_settings_max_tokens_5_gives_a_five_token_answer(page):
    sign_up(page, "ui-settings")
    ask_and_stop(page, "Hello")

    page.locator("summary", has_text="Settings").click()
    page.get_by_label("Max tokens").fill("5")
    page.get_by_role("button", name="Save settings").click()
    expect(page.get_by_role("status")).to_contain_text("Saved.")

    page.get_by_label("Message").fill("Five words please")
    page.get_by_role("button", name="Send").click()
    answer = page.locator("article[data-role=assistant]").last
    expect(page.locator("article[data-role=assistant]")).to_have_count(2)
    expect(answer).to_have_attribute("data-status", "complete", timeout=30_000)
    expect(answer.locator(".message-meta")).to_contain_text("5 tokens")
    assert len(answer.locator(".message-body").inner_text().split()) == 5


def test_bad_settings_show_the_error_next_to_the_field(page):
    sign_up(page, "ui-bad-settings")
    ask_and_stop(page, "Hello")

    page.locator("summary", has_text="Settings").click()
    page.get_by_label("Temperature").fill("3")
    page.get_by_role("button", name="Save settings").click()

    expect(page.locator("#id_temperature_error")).to_have_text("Temperature is between 0 and 2.")
    expect(page.get_by_label("Temperature")).to_have_attribute("aria-invalid", "true")


def test_the_quota_meter_counts_down_after_a_send(page):
    sign_up(page, "ui-quota")
    meter = page.locator("#quota")
    expect(meter).to_have_text(re.compile(r"^20 requests left this minute · 200000 tokens left today$"))

    ask_and_stop(page, "Count me")

    expect(meter).to_contain_text("19 requests left this minute")


def test_on_a_phone_the_message_box_and_send_fit_without_sideways_scrolling(browser, synthetic_site):
    context = browser.new_context(base_url=synthetic_site.base_url, viewport={"width": 375, "height": 740})
    page = context.new_page()
    sign_up(page, "ui-phone-user-with-a-rather-long-name")

    def fits() -> None:
        expect(page.get_by_label("Message")).to_be_visible()
        expect(page.get_by_role("button", name="Send")).to_be_visible()
        assert page.evaluate("document.documentElement.scrollWidth") <= 375
        for element in (page.get_by_label("Message"), page.get_by_role("button", name="Send")):
            box = element.bounding_box()
            assert box
            assert box["x"] >= 0
            assert box["x"] + box["width"] <= 375

    fits()
    ask_and_stop(page, "A prompt with a veryveryveryveryveryveryveryveryverylongwordthatmustwrap inside")
    page.locator("summary", has_text="Settings").click()
    page.locator("summary", has_text="Rename").click()
    fits()
    context.close()


def log_in(page, username: str, password: str = PASSWORD) -> None:
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()


def test_log_out_and_back_in_through_the_login_page(page):
    sign_up(page, "ui-returning")
    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(re.compile(r"/accounts/login/$"))

    log_in(page, "ui-returning")

    expect(page).to_have_url(re.compile(r"/chat/$"))
    expect(page.get_by_label("Message")).to_be_visible()


def test_wrong_passwords_lock_the_log_in_and_the_page_says_so(page):
    sign_up(page, "ui-forgetful")
    page.get_by_role("button", name="Log out").click()
    for attempt in range(4):
        log_in(page, "ui-forgetful", f"not-my-password-{attempt}")
        expect(page.get_by_text("Please enter a correct username and password")).to_be_visible()

    log_in(page, "ui-forgetful", "not-my-password-4")
    expect(page.get_by_role("heading", name="Too many failed log-ins")).to_be_visible()
    expect(page.get_by_role("alert")).to_contain_text("Try again in 15 minutes")

    page.goto("/accounts/login/")
    log_in(page, "ui-forgetful")  # the right one, while locked
    expect(page.get_by_role("heading", name="Too many failed log-ins")).to_be_visible()
    page.goto("/chat/")
    expect(page).to_have_url(re.compile(r"/accounts/login/"))
