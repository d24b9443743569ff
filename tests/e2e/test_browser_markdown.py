"""Rendered answers in a real Chromium: sanitised Markdown, highlighted code, Copy buttons.

The synthetic model's text is fixed, so hostile answers are written straight into the
live site's database, as if a model had produced them, and then opened like a user would.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from playwright.sync_api import expect

from inference.generators import SYNTHETIC_TEXT
from tests.support.browser import sign_up
from tests.support.livesite import ROOT, LiveSite

SYNTHETIC_ENV = {"CHAT_ENABLE_SYNTHETIC": "1", "CHAT_MODEL": "synthetic", "CHAT_SYNTHETIC_TOKENS_PER_S": "200"}
XSS_PAYLOADS = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "[x](javascript:alert(1))",
    '<a href="http://e.x" onclick="alert(1)">y</a>',
]
PYTHON_CODE = "def greet(name):\n    return 'hi ' + name"
PYTHON_ANSWER = f"Here you are:\n\n```python\n{PYTHON_CODE}\n```"

# Writes a conversation whose assistant answers are the given texts; prints its id.
ADD_CONVERSATION = """
import json, os
from django.contrib.auth import get_user_model
from generation.models import Conversation, Message
user = get_user_model().objects.get(username=os.environ["MD_USERNAME"])
conversation = Conversation.objects.create(user=user, model="synthetic", title="Hostile answers")
for answer in json.loads(os.environ["MD_ANSWERS"]):
    Message.objects.create(conversation=conversation, role="user", content=answer)
    Message.objects.create(conversation=conversation, role="assistant", content=answer, status="complete")
print(conversation.id)
"""


@pytest.fixture(scope="module")
def synthetic_site(live_sites):
    return live_sites.site(SYNTHETIC_ENV)


@pytest.fixture
def context(browser, synthetic_site):
    context = browser.new_context(base_url=synthetic_site.base_url, permissions=["clipboard-read", "clipboard-write"])
    yield context
    context.close()


@pytest.fixture
def page(context):
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.dialogs = dialogs  # type: ignore[attr-defined]
    yield page
    assert dialogs == [], f"a script ran and opened a dialog: {dialogs}"


def add_conversation(site: LiveSite, username: str, answers: list[str]) -> str:
    env = {**site.env, "MD_USERNAME": username, "MD_ANSWERS": json.dumps(answers)}
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", ADD_CONVERSATION],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


def test_hostile_answers_show_as_text_and_run_nothing(page, synthetic_site):
    sign_up(page, "md-mallory")
    conversation_id = add_conversation(synthetic_site, "md-mallory", XSS_PAYLOADS)

    page.goto(f"/chat/{conversation_id}/")
    page.wait_for_load_state("networkidle")  # give any injected handler its chance to run

    answers = page.locator("article[data-role=assistant]")
    expect(answers).to_have_count(len(XSS_PAYLOADS))
    for answer, payload in zip(answers.all(), XSS_PAYLOADS, strict=True):
        expect(answer).to_have_attribute("data-status", "complete")
        expect(answer.locator(".message-body")).to_have_text(payload)  # shown as text, verbatim
    bodies = page.locator(".message-body")
    expect(bodies.locator("script")).to_have_count(0)
    expect(bodies.locator("img")).to_have_count(0)
    expect(bodies.locator("[onerror], [onclick]")).to_have_count(0)
    expect(page.locator('a[href^="javascript:" i]')).to_have_count(0)
    # The user's own messages stay plain text too.
    for question, payload in zip(page.locator("article[data-role=user]").all(), XSS_PAYLOADS, strict=True):
        expect(question.locator(".message-body")).to_have_text(payload)
    assert page.dialogs == []  # type: ignore[attr-defined]


def test_python_block_is_highlighted_with_a_copy_button_that_copies_the_code(page, context, synthetic_site):
    sign_up(page, "md-coder")
    conversation_id = add_conversation(synthetic_site, "md-coder", [PYTHON_ANSWER])

    page.goto(f"/chat/{conversation_id}/")

    body = page.locator("article[data-role=assistant] .message-body")
    expect(body.locator("p")).to_have_text("Here you are:")
    code = body.locator("pre > code.language-python.highlight")
    expect(code.locator("span.k", has_text="def")).to_be_visible()
    expect(code.locator("span.nf")).to_have_text("greet")
    assert code.text_content() == PYTHON_CODE + "\n"

    copy = body.get_by_role("button", name="Copy code")
    expect(copy).to_have_count(1)
    copy.click()
    expect(copy).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == PYTHON_CODE + "\n"

    # Without JavaScript there is no button that would do nothing.
    no_js = context.browser.new_context(
        base_url=synthetic_site.base_url, java_script_enabled=False, storage_state=context.storage_state()
    )
    try:
        plain = no_js.new_page()
        plain.goto(f"/chat/{conversation_id}/")
        expect(plain.locator("pre > code.highlight span.k").first).to_have_text("def")
        expect(plain.get_by_role("button", name="Copy code")).to_have_count(0)
    finally:
        no_js.close()


def test_streamed_answer_is_text_while_streaming_then_rendered_markdown_when_complete(page):
    sign_up(page, "md-streamer")
    page.get_by_label("Message").fill("Stream something")
    page.get_by_role("button", name="Send").click()
    answer = page.locator("article[data-role=assistant]").last

    # Read status and body in one step, so the answer cannot complete in between.
    read_state = "a => [a.dataset.status, a.querySelector('.message-body').childElementCount]"
    samples = 0
    while (state := answer.evaluate(read_state))[0] == "streaming":
        samples += 1
        assert state[1] == 0, "streamed text must be inserted as text nodes, not HTML"
        page.wait_for_timeout(50)
    assert samples > 0

    expect(answer).to_have_attribute("data-status", "complete", timeout=30_000)
    paragraph = answer.locator(".message-body.markdown > p")
    expect(paragraph).to_have_count(1)
    assert (paragraph.text_content() or "").startswith(SYNTHETIC_TEXT)
