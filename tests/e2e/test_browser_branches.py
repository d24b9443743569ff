"""Branches, settings before the first message, and export/import, in a real Chromium.

The synthetic model writes as many words as max_tokens allows and counts a prompt's
tokens as its words, so what the model was given for an answer can be read back from the
answer's prompt_tokens (in the JSON export): it tells which branch was the context.
"""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from tests.support.browser import sign_up

SYNTHETIC_ENV = {"CHAT_ENABLE_SYNTHETIC": "1", "CHAT_MODEL": "synthetic", "CHAT_SYNTHETIC_TOKENS_PER_S": "100"}
ANSWER_WORDS = 5
SYSTEM_PROMPT = "Be brief."  # 2 words


@pytest.fixture(scope="module")
def synthetic_site(live_sites):
    return live_sites.site(SYNTHETIC_ENV)


@pytest.fixture
def page(browser, synthetic_site):
    context = browser.new_context(base_url=synthetic_site.base_url, accept_downloads=True)
    page = context.new_page()
    yield page
    context.close()


def start_with_settings(page, prompt: str) -> None:
    """On a new chat, choose the settings first, then send the first prompt."""
    page.locator("summary", has_text="Settings").click()
    page.get_by_label("System prompt").fill(SYSTEM_PROMPT)
    page.get_by_label("Temperature").fill("0.5")
    page.get_by_label("Max tokens").fill(str(ANSWER_WORDS))
    send(page, prompt)
    expect(page).to_have_url(re.compile(r"/chat/[0-9a-f-]{36}/$"))


def send(page, prompt: str) -> None:
    prompts = page.locator("article[data-role=user]")
    before = prompts.count()
    page.get_by_label("Message").fill(prompt)
    page.get_by_role("button", name="Send").click()
    expect(prompts).to_have_count(before + 1)
    wait_complete(page)


def wait_complete(page) -> None:
    expect(page.locator("article[data-role=assistant]").last).to_have_attribute(
        "data-status", "complete", timeout=30_000
    )


def regenerate(page, versions: str) -> None:
    """Regenerate the last answer and wait for the new version (`versions`, "2/2") to be
    complete: the old answer is complete too until the new one replaces it."""
    page.get_by_role("button", name="Regenerate").click()
    expect(page.locator("article[data-role=assistant]").last.locator(".versions")).to_contain_text(versions)
    wait_complete(page)


def shown_prompts(page) -> list[str]:
    return page.locator("article[data-role=user] .message-body").all_inner_texts()


def exported(page) -> dict:
    """The conversation on the page, as its JSON export (through the page's own link)."""
    page.locator("summary", has_text="Export").click()
    href = page.get_by_role("link", name="JSON (all versions)").get_attribute("href")
    response = page.request.get(href)
    assert response.ok
    return json.loads(response.body())


def test_settings_chosen_before_the_first_message_apply_to_its_answer(page):
    sign_up(page, "branch-settings")

    start_with_settings(page, "Hello there")

    answer = page.locator("article[data-role=assistant]").last
    expect(answer.locator(".message-meta")).to_contain_text(f"{ANSWER_WORDS} tokens")
    assert len(answer.locator(".message-body").inner_text().split()) == ANSWER_WORDS
    page.reload()
    page.locator("summary", has_text="Settings").click()
    expect(page.get_by_label("System prompt")).to_have_value(SYSTEM_PROMPT)
    expect(page.get_by_label("Temperature")).to_have_value("0.5")
    document = exported(page)
    # The first answer's context: the system prompt (2 words) and the prompt (2 words).
    assert document["messages"][1]["prompt_tokens"] == 4


def test_a_bad_setting_on_a_new_chat_keeps_the_prompt_and_says_why(page):
    sign_up(page, "branch-bad-settings")
    page.locator("summary", has_text="Settings").click()
    page.get_by_label("Temperature").fill("3")
    page.get_by_label("Message").fill("Keep me")
    page.get_by_role("button", name="Send").click()

    # The field belongs to the composer, so the browser checks it before sending (the
    # server checks again: tests/generation/test_conversations.py).
    temperature = page.get_by_label("Temperature")
    assert temperature.evaluate("field => field.validationMessage")
    expect(page.get_by_label("Message")).to_have_value("Keep me")
    expect(page).to_have_url(re.compile(r"/chat/$"))
    expect(page.locator("#conversations a")).to_have_count(0)
    temperature.fill("1")
    page.get_by_role("button", name="Send").click()
    expect(page).to_have_url(re.compile(r"/chat/[0-9a-f-]{36}/$"))


def test_edit_and_regenerate_keep_versions_that_steer_the_next_answer_and_survive_a_reload(page):
    sign_up(page, "branch-walker")
    start_with_settings(page, "One two three")
    first_answer = page.locator("article[data-role=assistant]").last

    # Regenerate: the old answer becomes version 1 of 2.
    regenerate(page, "2/2")
    answer = page.locator("article[data-role=assistant]").last
    answer.get_by_role("button", name="Previous version").click()
    expect(answer.locator(".versions")).to_contain_text("1/2")
    expect(answer.get_by_role("button", name="Previous version")).to_be_disabled()
    expect(first_answer).to_be_visible()
    answer.get_by_role("button", name="Next version").click()
    expect(answer.locator(".versions")).to_contain_text("2/2")

    # Edit the prompt: a second version of it, with its own answer below.
    page.locator("article[data-role=user] summary", has_text="Edit").click()
    page.get_by_label("Your prompt").fill("Alpha")
    page.get_by_role("button", name="Save and ask again").click()
    prompt = page.locator("article[data-role=user]").first
    expect(prompt.locator(".message-body")).to_have_text("Alpha")
    expect(prompt.locator(".versions")).to_contain_text("2/2")
    expect(page.locator("article[data-role=assistant] .versions")).to_have_count(0)
    wait_complete(page)  # Alpha's answer (the old one was complete before the edit's swap)

    send(page, "Next")  # context: system 2 + "Alpha" 1 + answer 5 + "Next" 1
    expect(page.locator("article[data-role=user]")).to_have_count(2)

    # Back to the first version of the prompt: its branch, without "Next".
    page.locator("article[data-role=user]").first.get_by_role("button", name="Previous version").click()
    expect(page.locator("article[data-role=user]")).to_have_count(1)
    assert shown_prompts(page) == ["One two three"]
    expect(page.locator("article[data-role=assistant]").last.locator(".versions")).to_contain_text("2/2")

    page.reload()  # the choice is kept
    assert shown_prompts(page) == ["One two three"]
    expect(page.locator("article[data-role=user]").first.locator(".versions")).to_contain_text("1/2")

    send(page, "Again")  # context: system 2 + "One two three" 3 + answer 5 + "Again" 1
    assert shown_prompts(page) == ["One two three", "Again"]

    document = exported(page)
    by_text = {message["content"]: message for message in document["messages"]}
    answer_to = {message["parent"]: message for message in document["messages"] if message["role"] == "assistant"}
    assert answer_to[by_text["Next"]["id"]]["prompt_tokens"] == 2 + 1 + ANSWER_WORDS + 1
    assert answer_to[by_text["Again"]["id"]]["prompt_tokens"] == 2 + 3 + ANSWER_WORDS + 1
    assert len(document["messages"]) == 9  # every version kept


def test_export_then_import_gives_the_same_conversation_with_its_branches(page, tmp_path):
    sign_up(page, "branch-porter")
    start_with_settings(page, "Pack my bags")
    regenerate(page, "2/2")
    send(page, "Where to?")

    page.locator("summary", has_text="Export").click()
    with page.expect_download() as markdown:
        page.get_by_role("link", name="Markdown").click()
    text = markdown.value.path().read_text()
    assert text.startswith("# Pack my bags")
    assert "## Assistant (version 2 of 2)" in text
    assert "Where to?" in text
    with page.expect_download() as download:
        page.get_by_role("link", name="JSON (all versions)").click()
    saved = tmp_path / download.value.suggested_filename
    download.value.save_as(saved)
    assert saved.name == "pack-my-bags.json"

    page.get_by_role("link", name="Your data").click()
    page.get_by_label("Conversation file (JSON)").set_input_files(saved)
    page.get_by_role("button", name="Import conversation").click()

    expect(page).to_have_url(re.compile(r"/chat/[0-9a-f-]{36}/$"))
    expect(page.locator("#conversations a")).to_have_count(2)
    assert shown_prompts(page) == ["Pack my bags", "Where to?"]
    expect(page.locator("article[data-role=assistant]").first.locator(".versions")).to_contain_text("2/2")

    # A file that is no conversation: refused with the reason, nothing made.
    page.get_by_role("link", name="Your data").click()
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": "chatsite.conversation", "version": 9, "messages": []}')
    page.get_by_label("Conversation file (JSON)").set_input_files(broken)
    page.get_by_role("button", name="Import conversation").click()
    expect(page.locator(".errorlist")).to_contain_text("The file is version 9; this site reads version 1.")

    with page.expect_download() as everything:
        page.get_by_role("link", name="Export all my data").click()
    data = json.loads(everything.value.path().read_text())
    assert data["user"]["username"] == "branch-porter"
    assert [len(c["messages"]) for c in data["conversations"]] == [5, 5]
