"""What operators say of a model's residency, at the engine: "unload now" (never cutting a
running generation short), "keep warm" (never unloaded while idle, loaded now if out), the
orders read from elsewhere (the admin's, a plan's pin), and CHAT_MAX_LOADED_MODELS's
least-recently-used eviction (ModelBudget)."""

from __future__ import annotations

import logging
import time

import pytest

from inference.engine import Engine, Job
from inference.generators import GenerationParams
from inference.residency import ModelBudget, Residency, ResidencyOrders
from inference.streams import InMemoryStreamStore
from tests.inference.test_idle_unload import PROMPT, SHORT, CountedLoad, run, unloaded
from tests.support.engines import wait_for_terminal, wait_until


@pytest.fixture(params=["batched", "sequential"])
def scheduler(request) -> str:
    return request.param


@pytest.fixture
def engines():
    """Makes engines (started and loaded), and stops them after the test."""
    made: list[Engine] = []

    def make(load: CountedLoad | None = None, **kwargs) -> Engine:
        kwargs.setdefault("max_concurrent", 2)
        engine = Engine(load or CountedLoad(), InMemoryStreamStore(), **kwargs)
        made.append(engine)
        engine.start()
        assert engine.wait_ready(10)
        return engine

    yield make
    for engine in made:
        engine.stop(5)


def still_loaded_after(engine: Engine, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not engine.loaded:
            return False
        time.sleep(0.02)
    return True


def test_unload_now_frees_an_idle_model_at_once_and_the_next_job_loads_it_again(engines, scheduler):
    load = CountedLoad()
    engine = engines(load, scheduler=scheduler)  # no idle unload: only the operator's word frees it
    run(engine, "a")
    assert engine.unload_now()
    assert engine.residency == Residency.UNLOADED
    assert engine.generator is None
    assert engine.tokenizer is not None  # prompts are still counted
    assert engine.ready
    events = run(engine, "b")
    assert events[0].data == {"state": "loading"}
    assert events[-1].type == "done"
    assert load.count == 2


def test_unload_now_waits_for_the_running_generation_which_ends_whole(engines, scheduler):
    engine = engines(CountedLoad(tokens_per_s=5), scheduler=scheduler)
    engine.submit(Job("long", PROMPT, GenerationParams(max_tokens=3)))
    wait_until(lambda: any(e.type == "token" for e in engine.store.events("long")), timeout=5)
    assert not engine.unload_now()
    assert engine.unload_pending and engine.loaded
    events = wait_for_terminal(engine.store, "long", timeout=10)
    assert [e.type for e in events] == ["token"] * 3 + ["done"]
    assert events[-1].data["status"] == "complete"
    unloaded(engine)  # once it ended
    assert not engine.unload_pending


def test_unload_now_of_a_model_out_of_memory_leaves_no_order_behind(engines):
    engine = engines()
    assert engine.unload_now()
    assert not engine.unload_now()
    assert not engine.unload_pending
    run(engine, "a")  # loads it again
    assert still_loaded_after(engine, 0.3)


def test_a_model_kept_warm_is_never_unloaded_while_idle_nor_by_unload_now(engines, scheduler):
    engine = engines(scheduler=scheduler, idle_unload_s=0.1)
    engine.set_keep_warm(True)
    run(engine, "a")
    assert still_loaded_after(engine, 0.5)
    assert not engine.unload_now()
    assert engine.loaded
    engine.set_keep_warm(False)
    unloaded(engine)  # idle long enough: it goes at once


def test_keep_warm_loads_an_unloaded_model_now(engines):
    load = CountedLoad()
    engine = engines(load)
    assert engine.unload_now()
    engine.set_keep_warm(True)
    wait_until(lambda: engine.loaded, timeout=5)
    assert load.count == 2
    events = run(engine, "a")
    assert [e.type for e in events] == ["token"] * 3 + ["done"]  # no loading stage: it was warm


class Orders:
    """Orders as the database would give them, changed by the test; `failing` makes reads fail."""

    def __init__(self, **kwargs) -> None:
        self.now = ResidencyOrders(**kwargs)
        self.reads = 0
        self.failing = False

    def __call__(self) -> ResidencyOrders:
        self.reads += 1
        if self.failing:
            raise ConnectionError("database unreachable")
        return self.now


def test_orders_read_from_elsewhere_unload_once_per_request_and_keep_warm(engines):
    orders = Orders(unloads=3)  # asked three times before this process started: done then, not now
    load = CountedLoad()
    engine = engines(load, orders=orders, orders_every_s=0.02)
    wait_until(lambda: orders.reads >= 2, timeout=5)
    assert engine.loaded
    orders.now = ResidencyOrders(unloads=4)
    unloaded(engine)
    run(engine, "a")  # loaded again; the same order does not unload it twice
    reads = orders.reads
    wait_until(lambda: orders.reads >= reads + 3, timeout=5)
    assert engine.loaded
    orders.now = ResidencyOrders(keep_warm=True, unloads=5)  # pinned at once: the pin wins
    wait_until(lambda: engine.keep_warm, timeout=5)
    assert engine.loaded and not engine.unload_pending
    assert load.count == 2


def test_a_failed_read_of_the_orders_keeps_the_last_ones(engines, caplog):
    orders = Orders(keep_warm=True)
    engine = engines(orders=orders, orders_every_s=0.02, idle_unload_s=0.1)
    wait_until(lambda: engine.keep_warm, timeout=5)
    orders.failing = True
    reads = orders.reads
    with caplog.at_level(logging.ERROR):
        wait_until(lambda: orders.reads >= reads + 3, timeout=5)
    assert "Could not read the model's residency orders" in caplog.text
    assert engine.keep_warm and still_loaded_after(engine, 0.3)


def test_max_loaded_models_unloads_the_least_recently_used_idle_model(engines):
    budget = ModelBudget(2)
    first, second = engines(budget=budget), engines(budget=budget)
    run(first, "a")  # used after the second loaded: the second is the least recently used
    third = engines(budget=budget)
    assert third.loaded and first.loaded
    assert second.residency == Residency.UNLOADED
    events = run(second, "b")  # loads again, and makes room in its turn
    assert events[0].data == {"state": "loading"}
    assert second.loaded and third.loaded
    assert first.residency == Residency.UNLOADED  # now the least recently used


def test_one_loaded_model_at_most_each_load_takes_the_others_place(engines, scheduler):
    budget = ModelBudget(1)
    first = engines(scheduler=scheduler, budget=budget)
    second = engines(scheduler=scheduler, budget=budget)
    assert second.loaded and not first.loaded
    assert run(first, "a")[-1].type == "done"
    assert first.loaded and not second.loaded


def test_the_budget_never_unloads_a_kept_warm_or_busy_model_it_goes_over_instead(engines, caplog):
    budget = ModelBudget(1)
    warm = engines(budget=budget)
    warm.set_keep_warm(True)
    with caplog.at_level(logging.WARNING):
        other = engines(budget=budget)
    assert warm.loaded and other.loaded
    assert "loading one more over the limit" in caplog.text

    busy = engines(CountedLoad(tokens_per_s=5), budget=ModelBudget(1))
    busy.submit(Job("long", PROMPT, GenerationParams(max_tokens=3)))
    wait_until(lambda: busy.active == 1, timeout=5)
    assert busy.budget is not None
    newcomer = engines(budget=busy.budget)
    assert newcomer.loaded
    events = wait_for_terminal(busy.store, "long", timeout=10)
    assert [e.type for e in events] == ["token"] * 3 + ["done"]  # never cut short
    assert busy.loaded


def test_no_limit_by_default(engines):
    budget = ModelBudget()
    many = [engines(budget=budget) for _ in range(3)]
    assert all(engine.loaded for engine in many)
    assert run(many[0], "a", SHORT)[-1].type == "done"
