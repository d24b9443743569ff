"""The Content-Security-Policy in a real Chromium: the pages work under it and break none of it."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from api.openapi import openapi_document
from tests.support.browser import REPORT_VIOLATIONS, sign_up, wait_for_words

SYNTHETIC_ENV = {"CHAT_ENABLE_SYNTHETIC": "1", "CHAT_MODEL": "synthetic", "CHAT_SYNTHETIC_TOKENS_PER_S": "100"}
# Reports every violation to the test: through a binding, which the page's policy doesn't govern.


@pytest.fixture(scope="module")
def synthetic_site(live_sites):
    return live_sites.site(SYNTHETIC_ENV)


@pytest.fixture
def violations() -> list[str]:
    """What the page's policy blocked: its `securitypolicyviolation` events and Chromium's console reports."""
    return []


@pytest.fixture
def page(browser, synthetic_site, violations):
    context = browser.new_context(base_url=synthetic_site.base_url)
    page = context.new_page()
    page.expose_function("reportViolation", lambda violation: violations.append(violation))
    page.add_init_script(REPORT_VIOLATIONS)
    page.on("console", lambda message: "Content Security Policy" in message.text and violations.append(message.text))
    yield page
    context.close()


def test_no_violation_on_the_chat_page_while_an_answer_streams_and_after(page, violations):
    sign_up(page, "csp-alice")
    assert "script-src 'self'" in page.request.get("/chat/").headers["content-security-policy"]
    page.get_by_label("Message").fill("Stream something")
    page.get_by_role("button", name="Send").click()

    answer = page.locator("article[data-role=assistant]").last
    wait_for_words(answer, 5)
    expect(answer).to_have_attribute("data-status", "streaming")
    assert violations == []
    expect(answer).to_have_attribute("data-status", "complete", timeout=60_000)
    page.reload()  # the saved answer, rendered as Markdown
    expect(page.locator("article[data-role=assistant]").last).to_have_attribute("data-status", "complete")
    for path in ("/accounts/keys/", "/accounts/password_change/", "/v1/docs"):
        page.goto(path)

    assert violations == []


def test_the_policy_is_enforced_and_a_violation_would_be_seen(page, violations):
    page.goto("/accounts/login/")

    # What htmx does unless base.html's htmx-config says not to: an inline style element.
    page.evaluate("() => document.head.append(Object.assign(document.createElement('style'), {textContent: 'p {}'}))")

    page.wait_for_timeout(500)
    assert any(violation.startswith("style-src-elem blocked inline") for violation in violations), violations


def test_the_api_docs_page_renders_the_openapi_document_with_the_vendored_swagger_ui(page, violations, synthetic_site):
    errors: list[str] = []
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.on("pageerror", lambda error: errors.append(str(error)))
    outside: list[str] = []  # no CDN, no validator: the page loads only this site's files
    page.on("request", lambda request: request.url.startswith(synthetic_site.base_url) or outside.append(request.url))

    page.goto("/v1/docs")

    operations = page.locator(".opblock-summary-path")
    expect(operations.filter(has_text="/chat/completions").first).to_be_visible(timeout=20_000)
    document = openapi_document()
    verbs = {"get", "post", "put", "patch", "delete"}
    expect(operations).to_have_count(sum(len(verbs & item.keys()) for item in document["paths"].values()))
    page.locator(".opblock-summary-path", has_text="/chat/completions").first.click()  # unfolds its responses
    expect(page.locator(".responses-wrapper").first).to_contain_text("429")
    assert violations == []
    assert errors == []
    assert outside == []
