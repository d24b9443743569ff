"""The parts of GENERATION_BACKEND=celery, one at a time: tasks as data, the Redis
admission bound, the dispatcher, the worker's claim, housekeeping and titles.

The whole deployment, with real processes, is tests/test_celery_backend.py.
"""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest
from django.conf import settings as django_settings
from django.db import connections, transaction

from accounts.models import UsageRecord
from chatsite.celery import app
from generation import services, worker
from generation.backends import reaping, router, runtime
from generation.backends.dispatch import QUEUE_PRODUCER, CeleryDispatcher
from generation.models import Conversation, Message
from inference.backend import DeploymentQueue, GenerationTask
from inference.engine import EngineOverloaded, GenerationResult
from inference.generators import GenerationParams, SyntheticGenerator, load_chat_tokenizer
from inference.registry import resolve_model
from infrastructure.metrics import LoadCollector
from tests.support.engines import install_engine, wait_for_terminal, wait_until

# The engine's threads write while tests read: no test-wide transaction holding locks.
pytestmark = pytest.mark.django_db(transaction=True)


def task_for(stream_id: str = "s1", **kwargs) -> GenerationTask:
    params = GenerationParams(max_tokens=5, temperature=0.3, top_p=0.9, seed=7, stop=("\n\n",))
    return GenerationTask(stream_id, django_settings.CHAT_MODEL, [{"role": "user", "content": "Hi"}], params, **kwargs)


def test_a_task_survives_the_trip_through_json():
    task = task_for(message_id=12, ahead=3, priority=5, owner="42")

    assert GenerationTask.from_json(json.loads(json.dumps(task.to_json()))) == task


@pytest.fixture
def admission():
    if not os.environ.get("REDIS_URL"):
        pytest.skip("needs REDIS_URL (a real Redis)")
    from inference.admission import DeploymentAdmission

    prefix = f"chatsite-test-{uuid.uuid4().hex[:12]}"
    bound = DeploymentAdmission(os.environ["REDIS_URL"], prefix=prefix, max_queue=2)
    yield bound
    for key in bound._redis.scan_iter(match=f"{prefix}:*"):
        bound._redis.delete(key)


def test_admission_bounds_running_plus_waiting_by_live_workers_rows(admission):
    admission.register("m", "worker-1", rows=2, ttl_s=30)

    assert [admission.admit("m", f"s{n}") for n in range(4)] == [-2, -1, 0, 1]  # two rows, two places
    with pytest.raises(EngineOverloaded):
        admission.admit("m", "s5")
    assert admission.state("m") == (2, 4)

    admission.release("m", "s0")
    assert admission.admit("m", "s5") == 1
    assert admission.admit("other-model", "x") == 0  # no worker for it yet: it may wait


def test_a_worker_that_stops_registering_no_longer_counts(admission):
    admission.register("m", "worker-1", rows=3, ttl_s=30)
    admission.register("m", "worker-2", rows=5, ttl_s=0.2)
    assert admission.state("m") == (8, 0)

    time.sleep(0.3)

    assert admission.state("m") == (3, 0)


def test_admitted_lists_places_by_age(admission):
    admission.admit("m", "old")
    time.sleep(0.3)
    admission.admit("m", "new")

    assert admission.admitted("m", older_than_s=0.2) == ["old"]
    assert sorted(admission.admitted("m")) == ["new", "old"]
    assert admission.models() == ["m"]


def test_deployment_queue_fills_the_live_workers_rows_first(admission):
    admission.register("m", "worker-1", rows=2, ttl_s=30)
    for n in range(3):
        admission.admit("m", f"s{n}")

    assert admission.queue("m") == DeploymentQueue("m", running=2, waiting=1, rows=2)
    assert admission.queue("no-worker-yet") == DeploymentQueue("no-worker-yet", running=0, waiting=0, rows=0)


@pytest.fixture
def dispatcher(admission, stream_store, monkeypatch):
    queued: list[GenerationTask] = []
    stream_store.beat(QUEUE_PRODUCER, ttl_s=60)  # a generation worker is alive
    found = CeleryDispatcher(
        "synthetic", lambda: SyntheticGenerator(50), stream_store, admission, enqueue=queued.append
    )
    found.queued_tasks = queued
    return found


def test_dispatcher_tells_a_waiting_task_its_place_and_queues_it(dispatcher, stream_store):
    dispatcher.admission.register("synthetic", "w", rows=1, ttl_s=30)

    dispatcher.submit(task_for("first"))
    dispatcher.submit(task_for("second"))

    assert [t.stream_id for t in dispatcher.queued_tasks] == ["first", "second"]
    assert [t.ahead for t in dispatcher.queued_tasks] == [None, 0]
    assert stream_store.events("first") == []
    assert [(e.type, e.data) for e in stream_store.events("second")] == [("status", {"state": "queued", "ahead": 0})]
    assert (dispatcher.max_concurrent, dispatcher.active, dispatcher.queued) == (1, 1, 1)


def test_dispatcher_refuses_past_the_bound_and_queues_nothing(dispatcher, stream_store):
    for n in range(2):
        dispatcher.submit(task_for(f"s{n}"))  # no worker has loaded it yet: two may wait
    with pytest.raises(EngineOverloaded):
        dispatcher.submit(task_for("s2"))
    assert len(dispatcher.queued_tasks) == 2
    assert not stream_store.exists("s2")


def test_dispatcher_refuses_when_no_generation_worker_is_alive(admission, stream_store):
    dispatcher = CeleryDispatcher("synthetic", lambda: SyntheticGenerator(50), stream_store, admission)

    with pytest.raises(EngineOverloaded, match="no generation worker is alive"):
        dispatcher.submit(task_for("s1"))

    assert admission.state("synthetic") == (0, 0)
    assert not stream_store.exists("s1")  # no place held


def test_generation_start_under_celery_records_the_queue_as_producer(
    alice, dispatcher, stream_store, settings, monkeypatch
):
    settings.CHAT_MODEL = "synthetic"
    settings.CHAT_ENABLE_SYNTHETIC = True
    celery = router.CeleryBackend({"synthetic": dispatcher})
    runtime.current().backend = router.ModelRouter(celery, router.UpstreamBackend())

    with transaction.atomic():
        started = services.generation_start(
            user=alice,
            channel="api",
            model="synthetic",
            prompt="Hi",
            params=GenerationParams(max_tokens=5),
            requested_max_tokens=5,
        )
        assert dispatcher.queued_tasks == []  # not before the transaction commits

    record = UsageRecord.objects.get(stream_id=started.stream_id)
    assert record.producer == QUEUE_PRODUCER
    assert record.status == UsageRecord.Status.STREAMING
    assert dispatcher.queued_tasks[0].stream_id == started.stream_id
    assert dispatcher.queued_tasks[0].params.max_tokens == 5


def test_metrics_show_the_deployment_queue_that_every_web_process_shares(dispatcher, stream_store, settings, client):
    settings.CHAT_MODEL = "synthetic"
    settings.CHAT_ENABLE_SYNTHETIC = True
    previous = runtime.use(runtime.Runtime(store=stream_store, admission=dispatcher.admission))
    try:
        celery = router.CeleryBackend({"synthetic": dispatcher})
        runtime.current().backend = router.ModelRouter(celery, router.UpstreamBackend())
        dispatcher.admission.register("synthetic", "w", rows=1, ttl_s=30)
        for n in range(3):
            dispatcher.submit(task_for(f"s{n}"))
        # Another web process admitted this one: the gauges count it all the same.
        dispatcher.admission.admit("smollm2-135m-instruct", "elsewhere")

        text = client.get("/metrics").content.decode()
    finally:
        runtime.use(previous)

    assert 'chatsite_deployment_generations_running{model="synthetic"} 1.0' in text
    assert 'chatsite_deployment_generations_waiting{model="synthetic"} 2.0' in text
    assert 'chatsite_deployment_generation_rows{model="synthetic"} 1.0' in text
    assert 'chatsite_deployment_generations_waiting{model="smollm2-135m-instruct"} 1.0' in text


def test_a_scrape_without_redis_leaves_out_only_the_deployment_queue():
    def unreachable() -> list[DeploymentQueue]:
        raise ConnectionError("Redis is down")

    names = [metric.name for metric in LoadCollector(list, list, unreachable).collect()]

    assert "chatsite_active_generations" in names
    assert not [name for name in names if name.startswith("chatsite_deployment_")]


def queued_answer(user, stream_id: str = "q1") -> Message:
    conversation = Conversation.objects.create(user=user, model="synthetic")
    conversation.messages.create(role="user", content="Hi")
    UsageRecord.objects.create(user=user, channel="ui", model="synthetic", stream_id=stream_id, producer=QUEUE_PRODUCER)
    return conversation.messages.create(
        role="assistant", status="streaming", stream_id=stream_id, model="synthetic", producer=QUEUE_PRODUCER
    )


def test_a_queued_generation_is_claimed_once(alice):
    answer = queued_answer(alice)

    assert services.generation_claims(claims={"q1": answer.pk}, producer="worker-a") == {"q1"}
    assert services.generation_claims(claims={"q1": answer.pk}, producer="worker-b") == set()

    answer.refresh_from_db()
    assert answer.producer == "worker-a"
    assert UsageRecord.objects.get(stream_id="q1").producer == "worker-a"


def test_a_generation_settled_while_queued_is_not_claimed(alice):
    answer = queued_answer(alice)
    UsageRecord.objects.filter(stream_id="q1").update(status="interrupted")

    assert services.generation_claims(claims={"q1": answer.pk}, producer="worker-a") == set()


@pytest.fixture(autouse=True)
def _claims_connection_closed():
    yield
    # The worker keeps its claims thread's connection; the test database must be droppable.
    worker._ledger.submit(connections.close_all).result()


@pytest.fixture
def worker_admission(monkeypatch):
    released: list[tuple[str, str]] = []

    class Released:
        def release(self, model: str, stream_id: str) -> None:
            released.append((model, stream_id))

    monkeypatch.setattr(runtime, "admission", Released)
    return released


def test_the_worker_runs_a_claimed_task_to_the_end_and_frees_its_place(alice, fast_engine, worker_admission):
    answer = queued_answer(alice)
    fast_engine.store.create("q1")
    task = task_for("q1", message_id=answer.pk)

    assert worker.generate(GenerationTask.from_json(task.to_json())) == "complete"

    worker._ledger.submit(lambda: None).result()  # the ledger's record of the claim, written meanwhile
    answer.refresh_from_db()
    assert answer.status == "complete"
    assert answer.producer == runtime.PRODUCER
    assert answer.content
    assert UsageRecord.objects.get(stream_id="q1").completion_tokens == answer.completion_tokens
    assert wait_for_terminal(fast_engine.store, "q1")[-1].type == "done"
    assert worker_admission == [(django_settings.CHAT_MODEL, "q1")]


def test_the_worker_skips_a_task_delivered_again(alice, fast_engine, worker_admission):
    answer = queued_answer(alice)
    fast_engine.store.create("q1")
    fast_engine.store.claim("q1", "a-worker-that-died")

    assert worker.generate(task_for("q1", message_id=answer.pk)) == "skipped"
    assert fast_engine.store.events("q1") == []  # nothing generated
    answer.refresh_from_db()
    assert answer.status == "streaming"
    assert answer.producer == QUEUE_PRODUCER  # the reaper's, via the claim


def test_the_worker_skips_a_task_whose_stream_was_settled_while_it_waited(alice, fast_engine, worker_admission):
    answer = queued_answer(alice)
    fast_engine.store.create("q1")
    fast_engine.store.append("q1", "error", {"message": "interrupted"})

    assert worker.generate(task_for("q1", message_id=answer.pk)) == "skipped"
    assert [e.type for e in fast_engine.store.events("q1")] == ["error"]


def test_a_task_whose_stream_expired_while_it_waited_is_settled_not_run(alice, fast_engine, worker_admission):
    answer = queued_answer(alice)  # its stream was never created here: as if expired

    assert worker.generate(task_for("q1", message_id=answer.pk)) == "skipped"

    answer.refresh_from_db()
    assert answer.status == "interrupted"
    assert not fast_engine.store.exists("q1")
    assert UsageRecord.objects.get(stream_id="q1").status == "interrupted"  # no longer holds a stream of the user's


def test_a_claim_the_ledger_has_settled_meanwhile_stops_the_generation(alice, fast_engine):
    answer = queued_answer(alice)
    UsageRecord.objects.filter(stream_id="q1").update(status="interrupted")
    fast_engine.store.create("q1")

    worker._note_claim(task_for("q1", message_id=answer.pk), "worker-a")
    worker._ledger.submit(lambda: None).result()

    assert fast_engine.store.is_cancelled("q1")  # the engine stops it within a step


def test_claims_made_together_reach_the_ledger_in_one_write(alice, fast_engine, monkeypatch):
    answers = {stream_id: queued_answer(alice, stream_id) for stream_id in ("q1", "q2", "q3")}
    UsageRecord.objects.filter(stream_id="q3").update(status="interrupted")  # settled while it waited
    writes = []

    def counted(**kwargs):
        writes.append(kwargs["claims"])
        return services.generation_claims(**kwargs)

    monkeypatch.setattr(worker, "generation_claims", counted)
    for stream_id, answer in answers.items():
        fast_engine.store.create(stream_id)
        worker._note_claim(task_for(stream_id, message_id=answer.pk), "worker-a")
    worker._ledger.submit(lambda: None).result()

    assert writes == [{stream_id: answer.pk for stream_id, answer in answers.items()}]
    assert UsageRecord.objects.filter(producer="worker-a").count() == 3  # q3's too: this worker took it
    assert Message.objects.filter(producer="worker-a").count() == 3
    assert fast_engine.store.cancelled_among(["q1", "q2", "q3"]) == {"q3"}


def test_every_scheduled_housekeeping_task_exists():
    app.loader.import_default_modules()

    for entry in django_settings.CELERY_BEAT_SCHEDULE.values():
        assert entry["task"] in app.tasks, entry


def test_reaping_settles_dead_runs(alice, stream_store):
    conversation = Conversation.objects.create(user=alice, model="m")
    dead = conversation.messages.create(role="assistant", status="streaming", stream_id="d1", producer="gone:1:x")
    stream_store.create("d1")

    assert app.tasks["generation.reap_dead_runs"]() == 1

    dead.refresh_from_db()
    assert dead.status == "interrupted"
    assert stream_store.events("d1")[-1].type == "error"


def test_reaping_asks_about_the_worker_that_claimed_a_run_the_ledger_still_has_queued(alice, stream_store):
    stream_store.beat(QUEUE_PRODUCER, ttl_s=30)  # some worker lives
    stream_store.beat("worker-alive", ttl_s=30)
    for stream_id, claimant in (("waiting", None), ("on-live", "worker-alive"), ("on-dead", "worker-dead")):
        queued_answer(alice, stream_id)
        stream_store.create(stream_id)
        if claimant:
            stream_store.claim(stream_id, claimant)

    assert app.tasks["generation.reap_dead_runs"]() == 1

    statuses = dict(Message.objects.filter(role="assistant").values_list("stream_id", "status"))
    assert statuses == {"waiting": "streaming", "on-live": "streaming", "on-dead": "interrupted"}
    assert UsageRecord.objects.get(stream_id="on-dead").status == "interrupted"
    assert stream_store.events("on-dead")[-1].type == "error"


def test_reaping_gives_back_admission_places_of_runs_that_ended(alice, admission, stream_store, monkeypatch):
    runtime.use(runtime.Runtime(store=stream_store, admission=admission))  # the fixture's teardown restores
    runtime.current().backend = router.ModelRouter(router.CeleryBackend(), router.UpstreamBackend())
    UsageRecord.objects.create(user=alice, channel="api", model="m", stream_id="ended", status="complete")
    UsageRecord.objects.create(user=alice, channel="api", model="m", stream_id="running", producer=runtime.PRODUCER)
    admission.register("m", "w", rows=8, ttl_s=30)
    admission.admit("m", "ended")
    admission.admit("m", "running")
    admission.admit("m", "lost")  # queueing failed: no usage record was kept
    admission._redis.zadd(admission._keys("m")[2], {"ended": 0, "running": 0, "lost": 0})  # long ago

    reaping.runs_reap()

    assert admission.admitted("m") == ["running"]


# Titles


def first_exchange(user, *, title: str = "please explain tides") -> Message:
    conversation = Conversation.objects.create(user=user, model=django_settings.CHAT_MODEL, title=title)
    conversation.messages.create(role="user", content="please explain tides")
    return conversation.messages.create(
        role="assistant", status="complete", content="Tides are the rise and fall of the sea, caused by the Moon."
    )


@pytest.fixture(autouse=True)
def _titles(settings):
    settings.CHAT_AUTO_TITLE = True


@pytest.fixture
def titling_engine(stream_store):
    """The synthetic model writing four words, which make a title."""
    engine = install_engine(stream_store, SyntheticGenerator(tokens_per_s=500, answer_words=4))
    yield engine
    engine.stop(timeout=10)


def test_a_new_conversation_gets_the_models_title(alice, titling_engine):
    answer = first_exchange(alice)

    assert app.tasks["generation.title"](answer.pk)

    wait_until(lambda: Conversation.objects.get(pk=answer.conversation_id).title != "please explain tides", 5)
    title = Conversation.objects.get(pk=answer.conversation_id).title
    assert 0 < len(title) <= services.TITLE_LENGTH
    assert "\n" not in title


def test_a_renamed_conversation_keeps_its_name(alice, fast_engine):
    answer = first_exchange(alice, title="My tides notes")

    assert not services.conversation_title_start(answer_id=answer.pk)


def test_only_the_first_answer_titles(alice, fast_engine):
    answer = first_exchange(alice)
    answer.conversation.messages.create(role="user", content="more")
    later = answer.conversation.messages.create(role="assistant", status="complete", content="More.")

    assert not services.conversation_title_start(answer_id=later.pk)


def test_a_rename_during_titling_wins(alice, stream_store):
    answer = first_exchange(alice)
    Conversation.objects.filter(pk=answer.conversation_id).update(title="Renamed meanwhile")
    result = GenerationResult(text="Tides and the Moon", status="complete", finish_reason="stop")

    services.conversation_save_title(answer.conversation_id, "please explain tides", result)

    assert Conversation.objects.get(pk=answer.conversation_id).title == "Renamed meanwhile"


@pytest.mark.parametrize(
    ("text", "title"),
    [
        ('"Tides and the Moon"', "Tides and the Moon"),
        ("Title: Ocean tides explained.\nMore text", "Ocean tides explained"),
        ("**How tides work**", "How tides work"),
        ("Here's a possible title for the conversation:\n\nPython: A Beginner", "Python: A Beginner"),
        ("\n\n  ", ""),
        ("Sure! Here is a title: Lisbon in May", "Lisbon in May"),
        ("Don't Panic", "Don't Panic"),
    ],
)
def test_titles_are_cleaned(text, title):
    assert services.clean_title(text) == title


@pytest.mark.parametrize(
    "text",
    [
        # What SmolLM2-135M wrote when asked to title real first exchanges here.
        "The Great Barrier Reef is the largest coral reef in the world, with a height",
        "In the heart of autumn leaves, a moment to cherish,\nA moment to",
        "Here's a possible title for the conversation:\n\n\"How to Use a",
        # And what small models are known to write instead of a title.
        "Here's a possible title for the conversation:",
        "Conversation Title:",
        "New Chat",
        '"Untitled"',
        "I'm sorry, I can't help with that.",
        "Sure! I can help with that.",
        "x" * 100,
        "",
    ],
)
def test_what_is_no_title_is_refused(text):
    assert services.clean_title(text) == ""


def test_a_refused_title_leaves_the_first_prompts_words(alice, stream_store):
    answer = first_exchange(alice)
    result = GenerationResult(
        text="Here's a possible title for the conversation:", status="complete", finish_reason="stop"
    )

    services.conversation_save_title(answer.conversation_id, "please explain tides", result)

    assert Conversation.objects.get(pk=answer.conversation_id).title == "please explain tides"


def test_a_title_cut_off_by_the_token_limit_is_not_used(alice, stream_store):
    answer = first_exchange(alice)
    result = GenerationResult(text="Tides and the Moon", status="complete", finish_reason="length")

    services.conversation_save_title(answer.conversation_id, "please explain tides", result)

    assert Conversation.objects.get(pk=answer.conversation_id).title == "please explain tides"


def test_a_long_first_prompt_titles_with_whole_words():
    prompt = "Could you please explain to me how the tides of the oceans work, and why there are two a day?"

    title = services._first_prompt_title(prompt)

    assert title == "Could you please explain to me how the tides of the oceans…"
    assert len(title) <= services.TITLE_LENGTH


def test_finishing_a_first_answer_asks_for_a_title(alice_client, alice, titling_engine):
    alice_client.post("/chat/", {"prompt": "please explain tides"})
    conversation = Conversation.objects.get(user=alice)

    wait_until(lambda: Conversation.objects.get(pk=conversation.pk).title != "please explain tides", 10)


def test_real_model_titles_a_conversation_or_leaves_the_first_prompts_words(alice, real_engine, monkeypatch):
    answer = first_exchange(alice)
    attempts: list[str] = []
    save = services.conversation_save_title

    def recorded(conversation_id, replacing, result):
        save(conversation_id, replacing, result)
        attempts.append(result.text)

    monkeypatch.setattr(services, "conversation_save_title", recorded)

    assert services.conversation_title_start(answer_id=answer.pk)

    wait_until(lambda: bool(attempts), 60)
    title = Conversation.objects.get(pk=answer.conversation_id).title
    assert title in (services.clean_title(attempts[0]) or "please explain tides", "please explain tides")
    assert title.strip()
    assert len(title) <= services.TITLE_LENGTH


def test_web_processes_of_the_celery_backend_load_only_the_tokenizer(smollm):
    spec = resolve_model("smollm2-135m-instruct")
    tokenizer = load_chat_tokenizer(spec, cache_dir=django_settings.MODEL_CACHE_DIR, synthetic_tokens_per_s=50)
    prompt = [{"role": "user", "content": "How many tokens is this?"}]

    assert not hasattr(tokenizer, "model")
    assert tokenizer.count_prompt_tokens(prompt) == smollm.count_prompt_tokens(prompt)
    assert tokenizer.context_length == smollm.context_length
