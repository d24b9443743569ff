"""GENERATION_BACKEND=celery with real processes: two daphne web processes, a Celery
generation worker and beat with its housekeeping worker, on a real Redis (and PostgreSQL
when DATABASE_URL names one).

The web processes hold no model: every token below was generated in the worker.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid

import httpx
import pytest
import yaml
from openai import OpenAI

from generation.backends.jobs import TITLE_TASK
from tests.support.livesite import (
    ROOT,
    ChatClient,
    LiveSite,
    LiveWorker,
    free_port,
    scratch_database,
    scratch_redis_prefix,
    stop_process,
)

pytestmark = pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs REDIS_URL (a real Redis)")

ADMIN = ("admin", "an-admin-password-for-tests")


@pytest.fixture(scope="module")
def deployment():
    with scratch_database() as database_url, scratch_redis_prefix(os.environ["REDIS_URL"], "chatsite-celery") as prefix:
        env = {
            "DATABASE_URL": database_url,
            "REDIS_KEY_PREFIX": prefix,
            "GENERATION_BACKEND": "celery",
            "CHAT_ENABLE_SYNTHETIC": "1",
            "CHAT_MODEL": "synthetic",
            "CHAT_SYNTHETIC_TOKENS_PER_S": "50",
            "CHAT_AUTO_TITLE": "1",
            # Two rows and two queue places in all, so that the bound is easy to reach.
            "GENERATION_MAX_CONCURRENT": "2",
            "GENERATION_MAX_QUEUE": "2",
            "DJANGO_SECRET_KEY": "live-test-secret-key-not-for-production-use-0123456789",
        }
        with LiveSite(env=env) as a, LiveSite(env=env) as b:
            admin_env = {**a.env, "DJANGO_SUPERUSER_USERNAME": ADMIN[0], "DJANGO_SUPERUSER_PASSWORD": ADMIN[1]}
            subprocess.run([sys.executable, "manage.py", "ensure_superuser"], cwd=ROOT, env=admin_env, check=True)
            worker_env = {**a.env, "WORKER_METRICS_PORT": str(free_port())}
            with LiveWorker(worker_env) as worker, LiveWorker(a.env, queue="housekeeping", beat=True) as beat:
                yield a, b, worker, beat


def user_on(site: LiveSite) -> ChatClient:
    client = ChatClient(site.base_url)
    client.signup(f"user-{uuid.uuid4().hex[:8]}")
    return client


def stop(client: ChatClient, sent_html: str) -> None:
    assert client.stop(sent_html).status_code == 204


def first_events(client: ChatClient, stream_url: str, count: int, **kwargs) -> list:
    events = []
    for event in client.stream(stream_url, **kwargs):
        events.append(event)
        if len(events) == count or event.event in ("done", "error"):
            break
    return events


def text_of(events: list) -> str:
    return "".join(ChatClient.delta(e) for e in events if e.event == "token")


def deployment_queue(site: LiveSite, model: str) -> dict[str, float]:
    """The chatsite_deployment_* gauges of `model` on the site's /metrics."""
    text = httpx.get(f"{site.base_url}/metrics").text
    found = re.findall(rf'^chatsite_deployment_generations?_(\w+)\{{model="{model}"\}} (\S+)$', text, re.M)
    return {name: float(value) for name, value in found}


def test_stream_through_a_is_resumed_and_cancelled_through_b(deployment):
    a, b, worker, _ = deployment
    alice_a = user_on(a)
    alice_b = alice_a.same_session_on(b.base_url)
    generated_before = worker.log().count("Generating ")

    sent = alice_a.send("Stream from web A")
    first = first_events(alice_b, sent.stream_url, 5)  # watched through B
    assert {e.event for e in first} == {"token"}
    resumed = first_events(alice_b, sent.stream_url, 3, headers={"Last-Event-ID": first[-1].id})
    assert int(resumed[0].id) > int(first[-1].id)

    stop(alice_b, sent.html)  # cancelled through B: the worker's engine sees the flag
    whole = list(alice_a.stream(sent.stream_url))
    assert whole[-1].event == "done"
    assert 'data-status="stopped"' in whole[-1].data
    # Resumed on B where it left off: nothing skipped or repeated. (Tokens stored by the
    # time a reader reads come as one event under the last one's id: ids may jump.)
    assert text_of(whole).startswith(text_of(first) + text_of(resumed))
    words = text_of(whole).split()
    assert 8 <= len(words) < 512  # stopped well before its 512 tokens
    assert 'data-status="stopped"' in alice_b.http.get(sent.conversation_url).text
    assert worker.log().count("Generating ") == generated_before + 1  # the worker generated it


def test_queue_bound_and_places_hold_across_web_processes(deployment):
    a, b, _, _ = deployment
    users = [user_on(site) for site in (a, b, a, b, a)]
    running = [users[0].send("one"), users[1].send("two")]  # the two rows
    for client, sent in zip(users, running, strict=False):
        assert first_events(client, sent.stream_url, 1)[0].event == "token"

    waiting = [users[2].send("three"), users[3].send("four")]  # through A, then B
    places = [json.loads(first_events(c, s.stream_url, 1)[0].data) for c, s in zip(users[2:4], waiting, strict=True)]
    assert places == [{"state": "queued", "ahead": 0}, {"state": "queued", "ahead": 1}]

    refused = users[4].htmx_post("/chat/", {"prompt": "five"})  # the whole deployment is full
    assert refused.status_code == 503
    assert "busy" in refused.text
    # Either web process tells a scaler the whole deployment's queue, not its own share.
    for site in (a, b):
        assert deployment_queue(site, "synthetic") == {"waiting": 2.0, "running": 2.0, "rows": 2.0}

    stop(users[0], running[0].html)  # a row frees: "three" runs, "four" moves up
    after_three = first_events(users[2], waiting[0].stream_url, 2, headers={"Last-Event-ID": "1"})
    assert json.loads(after_three[0].data) == {"state": "running"}
    four = first_events(users[3], waiting[1].stream_url, 2, headers={"Last-Event-ID": "1"})
    assert json.loads(four[0].data) == {"state": "queued", "ahead": 0}
    for client, sent in ((users[1], running[1]), (users[2], waiting[0]), (users[3], waiting[1])):
        stop(client, sent.html)
        assert list(client.stream(sent.stream_url))[-1].event == "done"


def test_concurrent_stream_limit_is_per_user_across_web_processes(deployment):
    a, b, _, _ = deployment
    alice_a = user_on(a)
    alice_b = alice_a.same_session_on(b.base_url)
    one = alice_a.send("first")
    two = alice_b.send("second", conversation_url="/chat/")  # the default plan allows two at once
    third = alice_b.htmx_post("/chat/", {"prompt": "third"})
    assert third.status_code == 429
    assert "At most 2 answers can stream at once" in third.text
    for sent in (one, two):
        stop(alice_a, sent.html)
        assert list(alice_a.stream(sent.stream_url))[-1].event == "done"


def test_worker_killed_mid_answer_is_reaped_and_a_restarted_worker_serves(deployment):
    a, b, worker, _ = deployment
    alice = user_on(a)
    sent = alice.send("This answer will be cut short")
    seen = first_events(alice, sent.stream_url, 10)
    assert len(seen) == 10
    time.sleep(3)  # past the worker's periodic save of the text so far (every 2 s)
    worker.kill()
    killed_at = time.monotonic()

    rest = list(alice.stream(sent.stream_url, headers={"Last-Event-ID": seen[-1].id}))
    # The browser's stream ends with the answer rendered as interrupted (the store's error
    # event, rendered), within 15 s of the kill.
    assert rest[-1].event == "done" and 'data-status="interrupted"' in rest[-1].data, a.log()[-3000:]
    # Within 15 s as promised on a quiet machine (docs/scaling.md); 45 s whatever the load.
    assert time.monotonic() - killed_at <= 45
    page = alice.http.get(sent.conversation_url).text
    assert 'data-status="interrupted"' in page
    saved_words = text_of(seen).split()
    assert " ".join(saved_words[:5]) in page  # the text generated before the kill is kept

    log_before_restart = len(worker.log())
    worker.start()
    bob = user_on(b)
    answer = list(bob.stream(bob.send("After the restart").stream_url))
    assert answer[-1].event == "done"
    assert 'data-status="complete"' in answer[-1].data
    assert len([e for e in answer if e.event == "token"]) >= 20
    # The killed generation is not run again by the new worker: one task, the new one.
    assert worker.log()[log_before_restart:].count("Generating ") == 1
    time.sleep(1)
    assert 'data-status="interrupted"' in alice.http.get(sent.conversation_url).text


def test_beat_rolls_usage_up_and_a_task_titles_new_conversations(deployment):
    a, _, worker, _ = deployment
    carol = user_on(a)
    sent = carol.send("please explain tides to me")
    assert list(carol.stream(sent.stream_url))[-1].event == "done"  # a complete first exchange

    # A worker takes the title task and queues the title's generation (the task returns True).
    # The synthetic model's answer to it (its fixed text, cut off at the title's token limit)
    # is no title (generation.services.clean_title), so the prompt's words stay.
    deadline = time.monotonic() + 20
    while not re.search(rf"Task {re.escape(TITLE_TASK)}\[[^]]+\] succeeded in [^:]+: True", worker.log()):
        assert time.monotonic() < deadline, worker.log()[-2000:]
        time.sleep(0.5)
    time.sleep(1)  # the title's generation: 16 synthetic tokens at 50/s
    page = carol.http.get(sent.conversation_url).text
    assert re.search(r"<title>(.*?)</title>", page, re.S).group(1).strip().startswith("please explain tides to me")

    admin = httpx.Client(base_url=a.base_url, follow_redirects=True)
    login = admin.get("/admin/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.text).group(1)
    admin.post("/admin/login/", data={"csrfmiddlewaretoken": token, "username": ADMIN[0], "password": ADMIN[1]})
    deadline = time.monotonic() + 90  # beat rolls usage up every minute
    while time.monotonic() < deadline:
        daily = admin.get("/admin/accounts/usagerecord/daily/")
        assert daily.status_code == 200
        if "last updated" in daily.text:
            break
        time.sleep(2)
    else:
        pytest.fail(f"usage never rolled up:\n{daily.text[-3000:]}")


@pytest.fixture
def one_port(deployment, tmp_path):
    """nginx in front of both web processes, configured as docker-compose.yml's proxy."""
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if nginx is None:
        if os.environ.get("CHATSITE_REQUIRE_NGINX") == "1":
            pytest.fail("nginx is missing: apt-get install -y nginx")
        pytest.skip("nginx is missing: apt-get install -y nginx")
    a, b, _, _ = deployment
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    port = free_port()
    site = compose["services"]["proxy"]["environment"]["NGINX_CONF"].replace("$$", "$")
    site = site.replace("server web:8000;", f"server 127.0.0.1:{a.port}; server 127.0.0.1:{b.port};")
    site = site.replace("listen 80;", f"listen 127.0.0.1:{port};")
    temp = " ".join(
        f"{kind}_temp_path {tmp_path}/{kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    (tmp_path / "nginx.conf").write_text(
        f"pid {tmp_path}/nginx.pid; error_log {tmp_path}/error.log; events {{}}\n"
        f"http {{ access_log {tmp_path}/access.log; {temp}\n{site}\n}}\n"
    )
    process = subprocess.Popen([nginx, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-g", "daemon off;"])
    base_url = f"http://127.0.0.1:{port}"
    wait_until_listening(base_url)
    yield base_url
    stop_process(process)


def wait_until_listening(base_url: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            httpx.get(f"{base_url}/healthz", timeout=1)
            return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_two_web_processes_behind_one_port_stream_token_by_token(deployment, one_port):
    a, b, _, _ = deployment
    requests_before = (a.log().count('"GET /'), b.log().count('"GET /'))
    erin = ChatClient(one_port)
    erin.signup(f"erin-{uuid.uuid4().hex[:6]}")

    sent = erin.send("Through the proxy")
    events = list(erin.stream(sent.stream_url))

    tokens = [e for e in events if e.event == "token"]
    assert events[-1].event == "done"
    assert len(tokens) >= 20
    assert tokens[-1].at - tokens[0].at > 1  # streamed as generated: the proxy does not buffer
    for _ in range(4):
        erin.http.get("/chat/")
    served = (a.log().count('"GET /') - requests_before[0], b.log().count('"GET /') - requests_before[1])
    assert min(served) > 0, served  # both web processes served requests through the one port


def test_real_model_through_the_worker_with_the_openai_client(deployment):
    a, b, worker, _ = deployment
    dave = user_on(b)
    page = dave.http.get("/accounts/keys/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    created = dave.http.post("/accounts/keys/", data={"csrfmiddlewaretoken": token, "name": "celery test"})
    key = re.search(r"(cs-[A-Za-z0-9_-]{40,})", created.text).group(1)

    # Not the default model: web A loads its tokenizer on first use, answering 503 with
    # Retry-After meanwhile (the client waits and retries), and the worker its weights.
    client = OpenAI(base_url=f"{a.base_url}/v1", api_key=key, max_retries=20)
    stream = client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=12,
        temperature=0,
        stream=True,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert chunks[-1].choices == [] or chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)

    # The worker generated it, and exports its own metrics.
    metrics = httpx.get(f"http://127.0.0.1:{worker.env['WORKER_METRICS_PORT']}/metrics").text
    assert re.search(
        r'^chatsite_generations_total\{model="smollm2-135m-instruct",status="complete"\} [1-9]', metrics, re.M
    )
    assert re.search(r'^chatsite_ttft_seconds_count\{model="smollm2-135m-instruct"\} [1-9]', metrics, re.M)
    assert 'chatsite_active_generations{model="synthetic"}' in metrics
