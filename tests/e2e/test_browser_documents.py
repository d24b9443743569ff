"""Documents in a real Chromium: attach a file (with upload progress), get an answer that
cites it, see the same sources after a reload, open a cited passage, refuse a broken file."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.documents.corpus import DOCUMENTS
from tests.support.browser import sign_up

SYNTHETIC_ENV = {"CHAT_ENABLE_SYNTHETIC": "1", "CHAT_MODEL": "synthetic", "CHAT_SYNTHETIC_TOKENS_PER_S": "400"}
# Big enough for the upload to report progress on its way: the tides text, then padding.
TIDES = (
    DOCUMENTS["tides.txt"] + "\n\n" + "\n\n".join(f"Appendix paragraph {i} of padding." for i in range(8000))
).encode()


@pytest.fixture(scope="module")
def synthetic_site(live_sites):
    return live_sites.site(SYNTHETIC_ENV)


@pytest.fixture
def page(browser, synthetic_site):
    context = browser.new_context(base_url=synthetic_site.base_url)
    page = context.new_page()
    yield page
    context.close()


def ask(page, prompt: str):
    page.get_by_label("Message").fill(prompt)
    page.get_by_role("button", name="Send").click()
    answer = page.locator("article[data-role=assistant]").last
    expect(answer).to_have_attribute("data-status", "complete", timeout=20_000)
    return answer


def test_an_attached_file_is_cited_under_the_answer_and_after_a_reload(page):
    sign_up(page, "docs-reader")
    ask(page, "Hello")
    expect(page).to_have_url(re.compile(r"/chat/[0-9a-f-]{36}/$"))
    page.evaluate(
        """window.progressSeen = [];
        document.addEventListener("htmx:xhr:progress", (event) => {
          const bar = event.target.querySelector("[data-upload-progress]");
          if (bar) window.progressSeen.push({hidden: bar.hidden, value: bar.value});
        });"""
    )

    page.locator("summary", has_text="Documents").click()
    page.get_by_label("Attach a file").set_input_files({"name": "tides.txt", "mimeType": "text/plain", "buffer": TIDES})
    page.get_by_role("button", name="Upload").click()

    documents = page.get_by_role("list", name="Attached documents")
    expect(documents).to_contain_text("tides.txt", timeout=30_000)  # an upload on two busy cores
    progress = page.evaluate("window.progressSeen")
    assert progress
    assert not progress[-1]["hidden"]
    assert progress[-1]["value"] == 100

    answer = ask(page, "When do spring tides happen?")
    sources = answer.get_by_role("list", name="Sources")
    expect(sources.get_by_role("link").first).to_have_text("[1] tides.txt")
    expect(sources).to_contain_text("Ocean tides are caused mainly by the gravitational pull of the Moon")

    page.reload()
    answer = page.locator("article[data-role=assistant]").last
    first_source = answer.get_by_role("list", name="Sources").get_by_role("link").first
    expect(first_source).to_have_text("[1] tides.txt")

    first_source.click()
    expect(page.get_by_role("heading", name="tides.txt")).to_be_visible()
    expect(page.locator(".passage-text")).to_contain_text("Spring tides, with the largest range")
    page.get_by_role("link", name="Back to the conversation").click()
    expect(page.get_by_role("list", name="Attached documents")).to_contain_text("tides.txt")


def test_a_broken_file_is_refused_with_a_message_and_a_removed_one_is_gone(page):
    sign_up(page, "docs-remover")
    ask(page, "Hello")
    page.locator("summary", has_text="Documents").click()
    upload = page.get_by_label("Attach a file")

    upload.set_input_files({"name": "scan.pdf", "mimeType": "application/pdf", "buffer": b"%PDF-1.4 broken"})
    page.get_by_role("button", name="Upload").click()
    expect(page.locator("#documents [role=alert]")).to_have_text(
        "scan.pdf is not a PDF that can be read (it may be damaged)."
    )

    page.get_by_label("Attach a file").set_input_files(
        {"name": "bees.md", "mimeType": "text/markdown", "buffer": DOCUMENTS["honeybees.md"].encode()}
    )
    page.get_by_role("button", name="Upload").click()
    # The upload's request no longer loads the embedding model (3-9 s on two busy cores:
    # documents.services.document_add); the long wait is kept for a busy machine.
    expect(page.get_by_role("list", name="Attached documents")).to_contain_text("bees.md", timeout=30_000)
    expect(page.locator("#documents [role=alert]")).to_have_count(0)

    page.get_by_role("button", name="Remove bees.md").click()
    expect(page.locator("#documents summary")).to_have_text("Documents (0)")
    answer = ask(page, "What does the waggle dance tell workers?")
    expect(answer.locator("[data-sources] li")).to_have_count(0)
