"""Reading and finding conversations in a real Chromium: the view follows the stream, Jump to
latest, Copy, Esc, the new-chat shortcut, the theme, the phone's drawer, search, and the
admin's usage chart, all under the site's Content-Security-Policy.

The synthetic model (a fixed text at 50 words/s, 512 words an answer) keeps answers countable.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from playwright.sync_api import expect

from tests.support import PASSWORD
from tests.support.browser import REPORT_VIOLATIONS, sign_up
from tests.support.livesite import ROOT

SYNTHETIC_ENV = {"CHAT_ENABLE_SYNTHETIC": "1", "CHAT_MODEL": "synthetic", "CHAT_SYNTHETIC_TOKENS_PER_S": "50"}
CONVERSATION_URL = re.compile(r"/chat/[0-9a-f-]{36}/$")
AT_BOTTOM = "() => { const s = document.scrollingElement; return s.scrollHeight - s.scrollTop - s.clientHeight < 80; }"


@pytest.fixture(scope="module")
def synthetic_site(live_sites):
    return live_sites.site(SYNTHETIC_ENV)


@pytest.fixture
def violations() -> list[str]:
    return []


@pytest.fixture
def open_page(browser, synthetic_site, violations):
    """A new page in a context of its own (viewport, permissions, colour scheme as asked)."""
    contexts = []

    def open_page(**context_options):
        context = browser.new_context(base_url=synthetic_site.base_url, **context_options)
        contexts.append(context)
        page = context.new_page()
        page.expose_function("reportViolation", lambda violation: violations.append(violation))
        page.add_init_script(REPORT_VIOLATIONS)
        return page

    yield open_page
    for context in contexts:
        context.close()
    assert violations == []


def send(page, prompt: str):
    """Send a prompt; returns its answer, which starts streaming."""
    page.get_by_label("Message").fill(prompt)
    page.get_by_role("button", name="Send").click()
    answer = page.locator("article[data-role=assistant]").last
    expect(answer).to_have_attribute("data-status", "streaming")
    return answer


def stop(page, answer) -> None:
    page.get_by_role("button", name="Stop").click()
    expect(answer).to_have_attribute("data-status", "stopped", timeout=10_000)


def test_the_view_follows_the_answer_until_the_reader_scrolls_up_and_jump_to_latest_returns(open_page):
    page = open_page(viewport={"width": 900, "height": 420})
    sign_up(page, "reader-follows")
    answer = send(page, "Tell me a long story")
    jump = page.get_by_role("button", name="Jump to latest")

    page.wait_for_function(
        "() => { const s = document.scrollingElement; return s.scrollHeight > s.clientHeight + 300; }"
    )
    page.wait_for_timeout(500)
    assert page.evaluate(AT_BOTTOM), "the view keeps the growing answer in sight"
    expect(jump).to_be_hidden()

    page.mouse.move(450, 200)
    page.mouse.wheel(0, -600)
    page.wait_for_function(f"() => !({AT_BOTTOM})()")
    expect(jump).to_be_visible()
    scrolled_to = page.evaluate("document.scrollingElement.scrollTop")
    page.wait_for_timeout(800)  # more words arrive meanwhile
    assert page.evaluate("document.scrollingElement.scrollTop") == scrolled_to, "the reader's place is kept"
    assert not page.evaluate(AT_BOTTOM)

    jump.click()
    expect(jump).to_be_hidden()
    page.wait_for_timeout(500)
    assert page.evaluate(AT_BOTTOM), "following again after the jump"
    stop(page, answer)


def test_copy_puts_the_answers_markdown_on_the_clipboard(open_page):
    page = open_page(permissions=["clipboard-read", "clipboard-write"])
    sign_up(page, "reader-copies")
    answer = send(page, "Say something to copy")
    expect(answer.locator(".message-body")).to_contain_text("Streaming tokens one")
    stop(page, answer)
    source = answer.locator("template[data-answer-source]").evaluate("template => template.content.textContent")
    assert source.startswith("Streaming tokens one at a time")

    answer.get_by_role("button", name="Copy answer").click()

    expect(answer.get_by_role("button", name="Copy answer")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == source
    expect(page.get_by_role("button", name="Copy answer")).to_have_count(1)  # one per answer


def test_esc_stops_the_running_answer_and_keeps_its_text(open_page):
    page = open_page()
    sign_up(page, "reader-escapes")
    answer = send(page, "Go on and on")
    expect(answer.locator(".message-body")).to_contain_text("Streaming tokens one")

    page.get_by_label("Message").press("Escape")

    expect(answer).to_have_attribute("data-status", "stopped", timeout=10_000)
    expect(answer.locator(".message-meta")).to_contain_text("Stopped")
    page.reload()
    expect(page.locator("article[data-role=assistant]")).to_have_attribute("data-status", "stopped")
    expect(page.locator("article[data-role=assistant] .message-body")).to_contain_text("Streaming tokens one")


def test_ctrl_shift_o_opens_a_new_chat_and_the_shortcuts_are_listed(open_page):
    page = open_page()
    sign_up(page, "reader-shortcut")
    stop(page, send(page, "A first chat"))
    expect(page).to_have_url(CONVERSATION_URL)

    page.keyboard.press("Control+Shift+O")

    expect(page).to_have_url(re.compile(r"/chat/$"))
    expect(page.locator("article")).to_have_count(0)
    page.get_by_text("Keyboard shortcuts").click()
    expect(page.locator(".shortcuts")).to_contain_text("New chat")
    expect(page.locator(".shortcuts")).to_contain_text("Stop the answer")


def background(page) -> str:
    return page.evaluate("getComputedStyle(document.body).backgroundColor")


def test_the_chosen_theme_is_remembered_across_reloads_and_system_follows_the_system(open_page):
    page = open_page(color_scheme="light")
    sign_up(page, "reader-theme")
    theme = page.get_by_label("Theme")
    expect(theme).to_have_value("system")
    light = background(page)

    theme.select_option("dark")
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    dark = background(page)
    assert dark != light

    page.reload()
    expect(page.get_by_label("Theme")).to_have_value("dark")
    assert background(page) == dark
    page.goto("/accounts/keys/")  # every page, not only the chat
    assert background(page) == dark

    page.get_by_label("Theme").select_option("system")
    assert background(page) == light
    page.emulate_media(color_scheme="dark")
    assert background(page) == dark
    page.reload()
    expect(page.locator("html")).not_to_have_attribute("data-theme", re.compile("."))


def test_on_a_phone_the_conversation_list_is_a_drawer(open_page):
    page = open_page(viewport={"width": 375, "height": 740})
    sign_up(page, "reader-phone")
    stop(page, send(page, "First phone chat"))
    page.get_by_role("link", name="New chat").click()
    stop(page, send(page, "Second phone chat"))
    toggle = page.get_by_role("button", name="Conversations")
    drawer = page.get_by_role("complementary", name="Conversations")

    expect(drawer).to_be_hidden()
    expect(toggle).to_have_attribute("aria-expanded", "false")
    toggle.click()
    expect(drawer).to_be_visible()
    expect(toggle).to_have_attribute("aria-expanded", "true")
    page.wait_for_function("() => document.getElementById('sidebar').getBoundingClientRect().x === 0")  # slid in
    box = drawer.bounding_box()
    assert box
    assert box["width"] < 375

    page.keyboard.press("Escape")
    expect(drawer).to_be_hidden()
    expect(toggle).to_be_focused()

    toggle.click()
    drawer.get_by_role("link", name="First phone chat").click()
    expect(page.get_by_role("heading", name="First phone chat")).to_be_visible()
    expect(drawer).to_be_hidden()

    toggle.click()
    page.mouse.click(360, 400)  # beside the drawer
    expect(drawer).to_be_hidden()


def test_on_a_wide_screen_the_list_stays_beside_the_chat(open_page):
    page = open_page(viewport={"width": 1200, "height": 800})
    sign_up(page, "reader-wide")

    expect(page.get_by_role("complementary", name="Conversations")).to_be_visible()
    expect(page.get_by_role("button", name="Conversations")).to_be_hidden()


def test_search_shows_only_matching_conversations_with_the_match_highlighted(open_page):
    page = open_page()
    sign_up(page, "reader-searches")
    stop(page, send(page, "Plan a trip to Lisbon <b>soon</b>"))
    page.get_by_role("link", name="New chat").click()
    stop(page, send(page, "Bake some bread"))

    page.get_by_label("Search conversations").fill("lisb")

    results = page.locator("#search-results")
    expect(results.get_by_role("status")).to_have_text("1 conversation found")
    expect(results.get_by_role("link")).to_have_count(1)
    expect(results.locator("mark").first).to_have_text("Lisb")
    expect(results.get_by_role("link")).to_contain_text("Plan a trip to Lisbon <b>soon</b>")  # as text, not markup
    expect(page.locator("#conversations")).to_be_hidden()

    page.get_by_label("Search conversations").fill("")
    expect(page.locator("#conversations")).to_be_visible()
    expect(page.locator("#conversations a")).to_have_count(2)


def test_math_in_an_answer_is_shown_as_mathml(open_page, tmp_path):
    # The synthetic model writes no TeX: the answer comes in through the import page.
    answer = "Euler: $e^{i\\pi} + 1 = 0$, and\n\n$$\\int_0^1 x\\,dx = \\frac{1}{2}$$"
    document = {
        "format": "chatsite.conversation",
        "version": 1,
        "title": "Math",
        "current": 1,
        "messages": [
            {"id": 0, "parent": None, "role": "user", "content": "Show me some math"},
            {"id": 1, "parent": 0, "role": "assistant", "content": answer, "status": "complete"},
        ],
    }
    saved = tmp_path / "math.json"
    saved.write_text(json.dumps(document))
    page = open_page()
    sign_up(page, "reader-math")
    page.get_by_role("link", name="Your data").click()
    page.get_by_label("Conversation file (JSON)").set_input_files(saved)
    page.get_by_role("button", name="Import conversation").click()

    body = page.locator("article[data-role=assistant] .message-body")
    expect(body.locator("math")).to_have_count(2)
    expect(body.locator('math[display="block"]')).to_have_count(1)
    expect(body.locator("math mfrac")).to_have_count(1)
    assert "$" not in body.inner_text()
    # Rendered by the browser as math, not as raw TeX or an empty box.
    assert body.locator("math").first.bounding_box()["width"] > 20


def test_the_admin_sees_tokens_per_day_per_plan_on_the_usage_page(open_page, synthetic_site):
    page = open_page()
    sign_up(page, "reader-spends")
    stop(page, send(page, "Use some tokens"))
    env = {
        **synthetic_site.env,
        "DJANGO_SUPERUSER_USERNAME": "chart-admin",
        "DJANGO_SUPERUSER_PASSWORD": PASSWORD,
        "DJANGO_SUPERUSER_EMAIL": "admin@example.com",
    }
    subprocess.run([sys.executable, "manage.py", "ensure_superuser"], cwd=ROOT, env=env, check=True)

    admin = open_page()
    admin.goto("/admin/login/?next=/admin/accounts/usagerecord/")
    admin.get_by_label("Username").fill("chart-admin")
    admin.get_by_label("Password").fill(PASSWORD)
    admin.get_by_role("button", name="Log in").click()

    chart = admin.locator("[data-role=usage-chart]")
    expect(chart).to_be_visible()
    expect(chart.get_by_role("img")).to_be_visible()
    expect(chart.locator("rect[data-label*='default:']")).to_have_count(1)
    box = chart.locator("rect[data-label*='default:']").bounding_box()
    assert box
    assert box["height"] > 1
    assert box["width"] > 1
    expect(chart.locator(".usage-chart-legend")).to_contain_text("default")
