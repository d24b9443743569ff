"""The waiting order: by priority, then in turns across users, then by arrival
(inference/fair_queue.py), alone and through the engine with the synthetic model."""

from __future__ import annotations

import asyncio
import random
import threading
from dataclasses import dataclass

import pytest
from aiohttp import web

from accounts.models import Plan, UsageRecord
from accounts.services import account_for, api_key_create
from inference.engine import Engine, GenerationResult, Job
from inference.fair_queue import FairQueue
from inference.generators import GenerationParams, SyntheticGenerator
from inference.streams import InMemoryStreamStore
from inference.upstream import UpstreamPool, endpoint_from_json
from tests.support.api_client import CHAT, post
from tests.support.engines import install_engine, wait_for_terminal, wait_until
from tests.support.upstreams import ScriptedServer, event_stream

PROMPT = [{"role": "user", "content": "Hi"}]


@dataclass(eq=False)
class Item:
    name: str
    owner: str = ""
    priority: int = 0


def names(queue: FairQueue[Item]) -> list[str]:
    return [item.name for item in queue]


def queue_of(*items: Item) -> FairQueue[Item]:
    queue: FairQueue[Item] = FairQueue()
    for item in items:
        queue.append(item)
    return queue


def take_all(queue: FairQueue[Item]) -> list[str]:
    return [queue.popleft().name for _ in range(len(queue))]


def test_one_owner_is_first_come_first_served():
    queue = queue_of(*(Item(f"n{n}") for n in range(5)))
    assert names(queue) == ["n0", "n1", "n2", "n3", "n4"]
    assert take_all(queue) == ["n0", "n1", "n2", "n3", "n4"]


def test_a_single_request_waits_at_most_one_turn_behind_a_user_with_twenty():
    queue = queue_of(*(Item(f"a{n}", "alice") for n in range(20)), Item("b0", "bob"))
    assert queue.index(queue[1]) == 1
    assert queue[1].name == "b0"
    assert take_all(queue)[:3] == ["a0", "b0", "a1"]


def test_three_users_take_turns_in_arrival_order_within_a_turn():
    queue = queue_of(
        *(Item(f"a{n}", "alice") for n in range(3)),
        *(Item(f"b{n}", "bob") for n in range(3)),
        *(Item(f"c{n}", "carol") for n in range(3)),
    )
    assert take_all(queue) == ["a0", "b0", "c0", "a1", "b1", "c1", "a2", "b2", "c2"]


def test_higher_priority_is_taken_first_then_turns_within_it():
    queue = queue_of(
        Item("a0", "alice"),
        Item("a1", "alice"),
        Item("p0", "pat", priority=10),
        Item("p1", "pat", priority=10),
        Item("q0", "quinn", priority=10),
        Item("low", "lou", priority=-5),
    )
    assert take_all(queue) == ["p0", "q0", "p1", "a0", "a1", "low"]


def test_a_user_just_served_waits_behind_those_not_yet_served_this_turn():
    queue = queue_of(Item("a0", "alice"), Item("a1", "alice"), Item("b0", "bob"))
    assert queue.popleft().name == "a0"
    queue.append(Item("a2", "alice"))
    queue.append(Item("c0", "carol"))  # arrives after alice's, but alice had her turn
    assert names(queue) == ["b0", "c0", "a1", "a2"]


def test_taking_the_first_never_reorders_the_rest():
    queue = queue_of(
        *(Item(f"a{n}", "alice") for n in range(4)),
        Item("b0", "bob"),
        Item("c0", "carol", priority=1),
        Item("b1", "bob"),
    )
    while queue:
        told = names(queue)
        assert queue.popleft().name == told[0]
        assert names(queue) == told[1:]


def test_a_withdrawn_item_leaves_no_gap_and_does_not_count_as_a_turn():
    a = [Item(f"a{n}", "alice") for n in range(3)]
    queue = queue_of(*a, Item("b0", "bob"), Item("b1", "bob"))
    assert names(queue) == ["a0", "b0", "a1", "b1", "a2"]
    queue.remove(a[0])
    assert names(queue) == ["a1", "b0", "a2", "b1"]
    assert "a0" not in names(queue)
    assert len(queue) == 4


def test_forgets_owners_served_before_the_current_turn():
    queue = queue_of(*(Item(f"u{n}", f"user{n}") for n in range(50)))
    take_all(queue)
    queue.append(Item("again", "user0"))
    assert queue.popleft().name == "again"
    assert len(queue._served) == 1  # only the owner served in the current turn is kept


@pytest.mark.parametrize("seed", range(20))
def test_random_arrivals_withdrawals_and_takes_keep_the_order_rules(seed):
    chance = random.Random(seed)
    queue: FairQueue[Item] = FairQueue()
    taken: list[Item] = []
    arrived: list[Item] = []
    for step in range(300):
        roll = chance.random()
        if roll < 0.5 or not queue:
            item = Item(f"i{step}", f"user{chance.randrange(4)}", chance.choice([0, 0, 5]))
            arrived.append(item)
            queue.append(item)
        elif roll < 0.6:
            queue.remove(chance.choice(list(queue)))
        else:
            told = list(queue)
            first = queue.popleft()
            assert first is told[0]
            assert list(queue) == told[1:]  # the rest keep their places
            assert all(first.priority >= other.priority for other in told)
            taken.append(first)
        assert [queue.index(item) for item in queue] == list(range(len(queue)))
    for owner in {item.owner for item in arrived}:
        theirs = [item for item in taken if item.owner == owner]
        for priority in (0, 5):  # an owner's items of one priority leave in arrival order
            names = [item.name for item in theirs if item.priority == priority]
            assert names == sorted(names, key=lambda name: int(name[1:]))


def test_popleft_from_an_empty_queue_is_an_index_error():
    with pytest.raises(IndexError):
        FairQueue[Item]().popleft()


# -- through the engine, with the synthetic model ------------------------------------------


@pytest.fixture(params=["batched", "sequential"])
def paused_engine(request):
    """An engine with one row whose model loads only when the test says: every job
    submitted meanwhile waits, so the order they are taken in is the queue's alone."""
    store = InMemoryStreamStore()
    loaded = threading.Event()

    def load():
        loaded.wait(30)
        return SyntheticGenerator(tokens_per_s=2000, answer_words=2)

    engine = Engine(load, store, max_concurrent=1, max_queue=64, scheduler=request.param)
    engine.model_may_load = loaded  # the test's hand on the load (Engine.loaded is its state)
    yield engine
    loaded.set()
    engine.stop(10)


def submit(engine: Engine, taken: list[str], name: str, owner: str, priority: int = 0) -> None:
    def finished(result: GenerationResult) -> None:
        taken.append(name)  # one row: each finishes before the next is taken

    engine.submit(Job(name, PROMPT, GenerationParams(max_tokens=2), on_finish=finished, priority=priority, owner=owner))


def told_places(store: InMemoryStreamStore, names: list[str]) -> dict[str, int]:
    """The last place each waiting stream was told."""
    places = {}
    for name in names:
        queued = [e.data["ahead"] for e in store.events(name) if e.type == "status" and e.data["state"] == "queued"]
        if queued:
            places[name] = queued[-1]
    return places


def test_engine_takes_another_users_request_after_at_most_one_of_twenty_and_told_it(paused_engine):
    taken: list[str] = []
    alice = [f"a{n}" for n in range(20)]
    for name in alice:
        submit(paused_engine, taken, name, "alice")
    submit(paused_engine, taken, "b0", "bob")

    # Told before anything runs: bob's one is next after alice's first, and each of alice's
    # others was told again that it moved one place back.
    told = told_places(paused_engine.store, [*alice, "b0"])
    assert told["b0"] == 0
    assert [e.data for e in paused_engine.store.events("a1")] == [
        {"state": "queued", "ahead": 0},
        {"state": "queued", "ahead": 1},
    ]
    paused_engine.model_may_load.set()
    wait_until(lambda: len(taken) == 21, timeout=30)

    assert taken[:3] == ["a0", "b0", "a1"]
    # The places told match the order taken: the row runs the first, the rest wait behind it.
    assert {name: taken.index(name) - 1 for name in told} == told
    assert wait_for_terminal(paused_engine.store, "b0")[-1].type == "done"


def test_engine_takes_a_higher_priority_plans_request_first(paused_engine):
    taken: list[str] = []
    for n in range(3):
        submit(paused_engine, taken, f"a{n}", "alice")
    submit(paused_engine, taken, "vip", "victor", priority=10)
    # Nobody was ahead of it: never told to wait. The first of alice's, which had the free
    # row until then, is told it now waits; the others, that they moved one place back.
    assert told_places(paused_engine.store, ["vip", "a0", "a1", "a2"]) == {"a0": 0, "a1": 1, "a2": 2}
    paused_engine.model_may_load.set()
    wait_until(lambda: len(taken) == 4, timeout=30)
    assert taken == ["vip", "a0", "a1", "a2"]


def test_engine_takes_three_users_in_turns_and_tells_them_so(paused_engine):
    taken: list[str] = []
    names = [f"{user[0]}{n}" for user in ("alice", "bob", "carol") for n in range(3)]
    for name in names:
        submit(paused_engine, taken, name, {"a": "alice", "b": "bob", "c": "carol"}[name[0]])
    told = told_places(paused_engine.store, names)
    paused_engine.model_may_load.set()
    wait_until(lambda: len(taken) == 9, timeout=30)
    assert taken == ["a0", "b0", "c0", "a1", "b1", "c1", "a2", "b2", "c2"]
    assert {name: taken.index(name) - 1 for name in told} == told


def test_cancelling_a_waiting_request_tells_the_others_their_new_places():
    store = InMemoryStreamStore()
    engine = Engine(lambda: SyntheticGenerator(tokens_per_s=50, answer_words=10_000), store, max_concurrent=1)
    engine.submit(Job("long", PROMPT, GenerationParams(max_tokens=10_000), owner="dave"))
    wait_until(lambda: engine.active == 1 and engine.queued == 0, timeout=10)
    for name, owner in (("a1", "alice"), ("a2", "alice"), ("a3", "alice"), ("b1", "bob")):
        engine.submit(Job(name, PROMPT, GenerationParams(max_tokens=2), owner=owner))
    assert told_places(store, ["a1", "b1", "a2", "a3"]) == {"a1": 0, "b1": 1, "a2": 2, "a3": 3}

    engine.cancel("a1")
    # Alice's turn was not used: her next one takes it, ahead of bob's as a1 was.
    wait_until(lambda: told_places(store, ["a2", "a3"]) == {"a2": 0, "a3": 2}, timeout=10)
    assert told_places(store, ["b1"]) == {"b1": 1}
    assert len(store.events("a2")) == 3
    assert len(store.events("a3")) == 3  # each told once more
    assert wait_for_terminal(store, "a1")[-1].data["status"] == "stopped"
    engine.cancel("long")
    for name in ("b1", "a2", "a3"):
        assert wait_for_terminal(store, name)[-1].type == "done"
    engine.stop(10)


# -- the upstream pool's line for a model server's slots --------------------------------


def test_upstream_pool_takes_waiting_requests_in_the_same_fair_order_and_tells_them_so():
    store = InMemoryStreamStore()
    pool = UpstreamPool(store, health_interval_s=60)
    asked: list[str] = []  # the requests the model server received, in order
    release = asyncio.Event()

    async def model_server(request: web.Request) -> web.Response:
        name = (await request.json())["messages"][0]["content"]
        asked.append(name)
        if name == "holder":
            await release.wait()
        return event_stream([{"choices": [{"index": 0, "delta": {"content": name}, "finish_reason": "stop"}]}])

    with ScriptedServer(model_server) as upstream:
        endpoint = {"model": "remote", "base_url": upstream.base_url, "upstream_model": "m", "max_concurrent": 1}
        pool.configure([endpoint_from_json(endpoint, "e")])

        def submit(name: str, owner: str, priority: int = 0) -> None:
            messages = [{"role": "user", "content": name}]
            job = Job(name, messages, priority=priority, owner=owner)
            pool.submit(job, model="remote", prompt_tokens=1, body={"messages": messages})

        submit("holder", "dave")
        wait_until(lambda: asked == ["holder"], timeout=10)
        names = ["a0", "a1", "a2", "b0", "c0", "vip"]
        for name in names:
            submit(name, {"a": "alice", "b": "bob", "c": "carol", "v": "victor"}[name[0]], 10 if name == "vip" else 0)
            wait_until(lambda name=name: store.events(name), timeout=10)  # in line before the next comes
        expected = ["vip", "a0", "b0", "c0", "a1", "a2"]
        wait_until(lambda: told_places(store, names) == {name: expected.index(name) for name in names}, timeout=10)

        store.cancel("b0")  # leaves the line: those behind it are told they moved up
        assert wait_for_terminal(store, "b0", timeout=10)[-1].data["status"] == "stopped"
        expected.remove("b0")
        wait_until(
            lambda: told_places(store, expected) == {name: expected.index(name) for name in expected}, timeout=10
        )

        upstream.loop.call_soon_threadsafe(release.set)
        for name in expected:
            assert wait_for_terminal(store, name, timeout=10)[-1].type == "done"
        assert asked == ["holder", *expected]
        pool.shut_down(1)


# -- through the API, with the plan set on the user's account ------------------------------


@pytest.fixture
def one_row(stream_store):
    """An engine that runs one generation at a time: the others wait in its queue."""
    engine = install_engine(stream_store, SyntheticGenerator(tokens_per_s=200), max_concurrent=1)
    yield engine
    engine.stop(10)


def start_stream(user, max_tokens: int) -> str:
    """A resumable API stream of `user`'s, started and not read: it generates on. Its stream id."""
    key = api_key_create(user=user, name="test")[1]
    body = {**CHAT, "stream": True, "max_tokens": max_tokens, "stream_options": {"resumable": True}}
    response = post("/v1/chat/completions", body, key)
    assert response.status_code == 200, response.content
    return UsageRecord.objects.filter(user=user).order_by("created_at").last().stream_id


@pytest.mark.django_db(transaction=True)
def test_an_api_request_on_a_higher_priority_plan_goes_ahead_of_waiting_ones(alice, bob, django_user_model, one_row):
    account = account_for(alice)
    account.plan = Plan.objects.create(name="priority", priority=10)
    account.save()
    holder = start_stream(django_user_model.objects.create_user("dave"), max_tokens=1000)  # holds the row
    bobs = [start_stream(bob, max_tokens=400) for _ in range(2)]
    assert told_places(one_row.store, bobs) == {bobs[0]: 0, bobs[1]: 1}

    alices = start_stream(alice, max_tokens=4)

    assert told_places(one_row.store, [alices, *bobs]) == {alices: 0, bobs[0]: 1, bobs[1]: 2}
    one_row.store.cancel(holder)
    assert wait_for_terminal(one_row.store, alices)[-1].type == "done"
    # Alice's answer is whole while bob's first (two seconds of tokens) is still being written.
    assert not one_row.store.events(bobs[0])[-1].terminal
    assert one_row.store.events(bobs[1])[-1].data == {"state": "queued", "ahead": 0}
    for stream_id in bobs:
        one_row.store.cancel(stream_id)
