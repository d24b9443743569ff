"""The admin's "unload now" and "keep warm", plans that pin models warm, and
CHAT_MAX_LOADED_MODELS, as the site wires them: the orders are kept in the database, which
every process running the model reads (generation/residency.py)."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Permission
from django.urls import reverse

from accounts.models import Plan
from audit.models import AuditRecord
from generation.backends import runtime
from generation.models import ModelResidency
from generation.residency import model_residency_orders
from inference.engine import Engine, Job
from inference.generators import GenerationParams, SyntheticGenerator, load_generator
from inference.registry import resolve_model
from inference.residency import Residency
from tests.inference.test_idle_unload import vm_rss
from tests.support.engines import install_engine, wait_for_terminal, wait_until

CHANGELIST = "admin:generation_modelresidency_changelist"
PROMPT = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture
def model() -> str:
    return django_settings.CHAT_MODEL


@pytest.fixture
def engine(stream_store):
    """The chat model's engine in this process: the synthetic model, 1 word a second, so
    that an answer is still running while an admin action is posted (one took over the
    0.4 s that 5 words a second left, on PostgreSQL on a slow day)."""
    engine = install_engine(stream_store, SyntheticGenerator(tokens_per_s=1, answer_words=3))
    yield engine
    engine.stop(10)


def act(client, action: str, model: str):
    """Run an admin action on `model`'s row, as the changelist's form posts it."""
    client.get(reverse(CHANGELIST))  # the list makes the rows
    row = ModelResidency.objects.get(model=model)
    return client.post(reverse(CHANGELIST), {"action": action, "_selected_action": [row.pk]}, follow=True)


def shown(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def still_loaded_after(engine: Engine, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not engine.loaded:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.django_db
def test_the_admin_lists_each_model_the_deployment_runs_with_its_state_here(admin_client, engine, model):
    response = admin_client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    assert set(ModelResidency.objects.values_list("model", flat=True)) == set(runtime.model_names())
    assert model in response.content.decode()
    assert ">loaded<" in response.content.decode()


@pytest.mark.django_db
def test_unload_now_frees_an_idle_model_here_and_is_recorded(admin_client, engine, model):
    response = act(admin_client, "unload_now", model)
    assert shown(response) == [
        f"{model} is unloaded here; every other process that runs it follows within 5 s, once its generations end."
    ]
    assert engine.residency == Residency.UNLOADED
    assert engine.generator is None and engine.tokenizer is not None
    row = ModelResidency.objects.get(model=model)
    assert row.unload_requests == 1 and row.unload_requested_at is not None
    record = AuditRecord.objects.get(target=f"generation.modelresidency:{row.pk}")
    assert (record.action, record.changes) == (AuditRecord.Action.ADMIN_CHANGE, {"unload_requests": [0, 1]})
    # The next generation loads it again, its readers told first.
    engine.submit(Job("after", PROMPT, GenerationParams(max_tokens=2)))
    events = wait_for_terminal(engine.store, "after", timeout=10)
    assert events[0].data == {"state": "loading"} and events[-1].type == "done"


@pytest.mark.django_db
def test_unload_now_lets_a_running_generation_finish_whole_then_unloads(admin_client, engine, model):
    engine.submit(Job("running", PROMPT, GenerationParams(max_tokens=3)))
    wait_until(lambda: any(e.type == "token" for e in engine.store.events("running")), timeout=5)
    response = act(admin_client, "unload_now", model)
    assert shown(response)[0].startswith(f"{model} unloads here once its 1 running or waiting generation(s) end")
    assert engine.loaded
    events = wait_for_terminal(engine.store, "running", timeout=10)
    assert [e.type for e in events] == ["token"] * 3 + ["done"]
    assert events[-1].data["status"] == "complete"
    wait_until(lambda: engine.residency == Residency.UNLOADED, timeout=5)


@pytest.mark.django_db
def test_keep_warm_is_saved_for_every_process_and_the_idle_timer_leaves_the_model_alone(
    admin_client, stream_store, model
):
    engine = install_engine(stream_store, SyntheticGenerator(tokens_per_s=500, answer_words=3), idle_unload_s=0.2)
    try:
        response = act(admin_client, "keep_warm_on", model)
        assert "kept warm" in shown(response)[0]
        assert ModelResidency.objects.get(model=model).keep_warm
        assert model_residency_orders(model).keep_warm  # what a process reads, after a restart too
        wait_until(lambda: engine.loaded, timeout=5)  # loaded again if the idle timer was first
        assert still_loaded_after(engine, 0.6)
        act(admin_client, "keep_warm_off", model)
        wait_until(lambda: engine.residency == Residency.UNLOADED, timeout=5)
    finally:
        engine.stop(5)


@pytest.mark.django_db
def test_keep_warm_loads_an_unloaded_model_now(admin_client, engine, model):
    act(admin_client, "unload_now", model)
    assert not engine.loaded
    act(admin_client, "keep_warm_on", model)
    wait_until(lambda: engine.loaded, timeout=5)
    # Unload now ends keeping it warm (the operator's latest word).
    act(admin_client, "unload_now", model)
    assert not engine.loaded and not ModelResidency.objects.get(model=model).keep_warm


@pytest.mark.django_db
def test_a_plan_pins_a_model_warm_and_unload_now_is_refused_with_the_reason(admin_client, engine, model):
    Plan.objects.create(name="gold", warm_models=[model])
    assert model_residency_orders(model).keep_warm
    response = act(admin_client, "unload_now", model)
    assert shown(response) == [f"{model} is kept warm by the plan(s) gold: take it off their warm models first."]
    assert engine.loaded
    assert ModelResidency.objects.get(model=model).unload_requests == 0
    assert "gold" in admin_client.get(reverse(CHANGELIST)).content.decode()


@pytest.mark.django_db
def test_people_who_are_not_staff_cannot_reach_the_actions(alice_client, engine, model):
    ModelResidency.objects.create(model=model)
    row = ModelResidency.objects.get(model=model)
    for action in ("unload_now", "keep_warm_on"):
        response = alice_client.post(reverse(CHANGELIST), {"action": action, "_selected_action": [row.pk]})
        assert response.status_code == 302 and "/login/" in response["Location"]
    row.refresh_from_db()
    assert (row.unload_requests, row.keep_warm) == (0, False)
    assert engine.loaded


@pytest.mark.django_db
def test_staff_who_may_only_view_cannot_unload(client, django_user_model, engine, model):
    viewer = django_user_model.objects.create_user("viewer", password="x", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_modelresidency"))
    client.force_login(viewer)
    assert client.get(reverse(CHANGELIST)).status_code == 200
    row = ModelResidency.objects.get(model=model)
    client.post(reverse(CHANGELIST), {"action": "unload_now", "_selected_action": [row.pk]})
    row.refresh_from_db()
    assert row.unload_requests == 0
    assert engine.loaded


@pytest.mark.django_db(transaction=True)
def test_the_runtimes_engines_read_plan_pins_from_the_database_and_share_one_budget(
    settings, stream_store, monkeypatch
):
    settings.CHAT_ENABLE_SYNTHETIC = True
    settings.CHAT_MODEL = "synthetic"
    settings.CHAT_MODEL_IDLE_UNLOAD_S = 1
    settings.CHAT_MAX_LOADED_MODELS = 1
    monkeypatch.setattr(runtime, "ORDERS_EVERY_S", 0.1)
    gold = Plan.objects.create(name="gold", warm_models=["synthetic"])
    engine = runtime.local_engine()
    try:
        assert engine.wait_ready(10)
        assert engine.budget is not None and engine.budget.max_loaded == 1
        wait_until(lambda: engine.keep_warm, timeout=5)
        assert still_loaded_after(engine, 1.5)  # past the idle time: pinned
        gold.warm_models = []
        gold.save()
        wait_until(lambda: engine.residency == Residency.UNLOADED, timeout=5)
    finally:
        engine.stop(5)


@pytest.mark.slow  # loads the real model twice: about 7 s here
@pytest.mark.django_db
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/self/status")
def test_unload_now_gives_the_real_models_memory_back(admin_client, stream_store, model):
    load = partial(
        load_generator,
        resolve_model("smollm2-135m-instruct"),
        cache_dir=django_settings.MODEL_CACHE_DIR,
        device="cpu",
        dtype="float32",
        synthetic_tokens_per_s=50,
    )
    engine = Engine(load, stream_store, producer=runtime.PRODUCER, max_concurrent=2)
    engine.start()
    runtime.current().engines[model] = engine
    try:
        assert engine.wait_ready(120)
        engine.submit(Job("first", PROMPT, GenerationParams(max_tokens=8, temperature=0)))
        assert wait_for_terminal(stream_store, "first", timeout=60)[-1].type == "done"  # every weight touched
        loaded_rss = vm_rss()
        act(admin_client, "unload_now", model)
        assert engine.residency == Residency.UNLOADED
        # SmolLM2-135M in float32: about 540 MB of weights (as test_idle_unload measures).
        wait_until(lambda: loaded_rss - vm_rss() > 400 * 2**20, timeout=10)
    finally:
        engine.stop(10)
