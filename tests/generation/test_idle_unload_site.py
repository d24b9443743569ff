"""Idle unload as the site shows it: /readyz stays 200 and says `unloaded`, /metrics has
the loaded gauge and the load-time histogram, an API stream says `: loading model`, and
the chat page's script shows "Loading the model…"."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from accounts.services import api_key_create
from generation.backends import runtime
from inference.engine import Engine
from inference.generators import SyntheticGenerator
from inference.residency import Residency
from tests.support.api_client import CHAT, MODEL, post
from tests.support.engines import install_engine, wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def idle_engine(stream_store):
    """The chat model's engine, freed after 0.2 s idle, and already freed."""
    engine = install_engine(stream_store, SyntheticGenerator(tokens_per_s=500, answer_words=4), idle_unload_s=0.2)
    wait_until(lambda: engine.residency == Residency.UNLOADED, timeout=5)
    yield engine
    engine.stop(5)


@pytest.mark.django_db(transaction=True)
def test_readyz_stays_200_and_says_the_model_is_unloaded(client, idle_engine):
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["checks"]["model"] == "unloaded"


@pytest.mark.django_db(transaction=True)
def test_metrics_have_the_loaded_gauge_and_the_load_time(client, stream_store, settings):
    settings.CHAT_ENABLE_SYNTHETIC = True
    settings.CHAT_MODEL = "synthetic"
    settings.CHAT_MODEL_IDLE_UNLOAD_S = 1  # the setting, through the runtime's own wiring
    engine: Engine = runtime.local_engine()
    try:
        assert engine.wait_ready(10)
        text = client.get("/metrics").content.decode()
        assert 'chatsite_model_loaded{model="synthetic"} 1.0' in text
        assert 'chatsite_model_load_seconds_count{model="synthetic"}' in text
        wait_until(lambda: not engine.loaded, timeout=5)
        text = client.get("/metrics").content.decode()
        assert 'chatsite_model_loaded{model="synthetic"} 0.0' in text
    finally:
        engine.stop(5)


@pytest.mark.django_db(transaction=True)
def test_an_api_stream_says_the_model_loads_in_a_comment_before_its_content(alice, idle_engine):
    key = api_key_create(user=alice, name="test")[1]
    response = post("/v1/chat/completions", {**CHAT, "stream": True, "max_tokens": 4}, key)
    lines = b"".join(response).decode().splitlines()
    assert ": loading model" in lines
    first_content = next(
        n
        for n, line in enumerate(lines)
        if line.startswith("data: {") and '"delta":{"content"' in line and MODEL in line
    )  # the first text, after the role's chunk, which goes out before anything is generated
    assert lines.index(": loading model") < first_content
    assert lines[-2:] == ["data: [DONE]", ""] or lines[-1] == "data: [DONE]"
    assert idle_engine.loaded


# The chat page's script, given a `loading` status event, as htmx's SSE extension hands it over.
STATUS_LINE = """
const handlers = {};
globalThis.document = { addEventListener: (name, handler) => { handlers[name] = handler; }, querySelector: () => null };
globalThis.htmx = { onLoad: () => {} };
require(process.argv[1]);
const statusLine = { textContent: "" };
const article = { dataset: {}, querySelector: (selector) => (selector === "[data-stream-status]" ? statusLine : null) };
handlers["htmx:sseBeforeMessage"]({
  detail: { type: "status", lastEventId: "1", data: process.argv[2] },
  target: { closest: () => article },
  preventDefault: () => {},
});
console.log(statusLine.textContent);
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")
@pytest.mark.parametrize(
    ("status", "shown"),
    [({"state": "loading"}, "Loading the model…"), ({"state": "queued", "ahead": 2}, "Waiting — 2 ahead")],
)
def test_the_chat_shows_the_loading_stage(status, shown):
    done = subprocess.run(
        ["node", "-e", STATUS_LINE, str(ROOT / "static/js/chat.js"), json.dumps(status)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert done.stdout.strip() == shown
    assert django_settings.CHAT_MODEL_IDLE_UNLOAD_S == 0  # the default: never
