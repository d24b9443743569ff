"""A chat answer with tools that a fallback model takes (generation.services): the tools go
with it to a model that calls tools, and a model that cannot serves it without them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from generation import services
from generation.models import ModelFallback
from inference.backend import GenerationTask
from inference.engine import EngineOverloaded
from inference.generators import GenerationParams
from tools.services import ChatToolRunner

pytestmark = pytest.mark.django_db

ASKED = "remote"  # the conversation's model, on a model server
WITH_TOOLS = "remote-too"  # a fallback on a model server that takes tools
WITHOUT_TOOLS = "local"  # a fallback this site runs itself: no tools
SPECS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


@dataclass
class Backend:
    """The router's interface, as admission and submission use it: `down` models refuse at
    admission, `full` ones when queued."""

    down: set[str] = field(default_factory=set)
    full: set[str] = field(default_factory=set)
    submitted: list[GenerationTask] = field(default_factory=list)

    def models(self) -> list[str]:
        return [ASKED, WITH_TOOLS, WITHOUT_TOOLS]

    def features(self, model: str) -> frozenset[str]:
        return frozenset() if model == WITHOUT_TOOLS else frozenset({"tools"})

    def count_prompt_tokens(self, model: str, prompt: Any) -> int:
        if model in self.down:
            raise EngineOverloaded(f"{model} is down")
        return 5

    def context_length(self, model: str) -> int:
        return 1000

    def starts_early(self, model: str) -> bool:
        return False

    def producer(self, model: str) -> str:
        return "test"

    def submit(self, task: GenerationTask) -> None:
        if task.model in self.full:
            raise EngineOverloaded(f"{task.model}'s queue is full")
        self.submitted.append(task)


@pytest.fixture
def fake_backend(monkeypatch) -> Backend:
    fake = Backend()
    monkeypatch.setattr(services, "backend", lambda: fake)
    return fake


def fall_back_to(*models: str) -> None:
    for position, model in enumerate(models):
        ModelFallback.objects.create(model=ASKED, fallback=model, position=position)


def admit(user, *, tools: ChatToolRunner | None) -> services.Admitted:
    params = GenerationParams(max_tokens=50, extra={"tools": SPECS})
    prompt = [{"role": "user", "content": "What is 2 + 40?"}]
    return services.generation_admit(
        user=user, channel="ui", model=ASKED, prompt=prompt, params=params, requested_max_tokens=None, tools=tools
    )


def runner() -> ChatToolRunner:
    return ChatToolRunner(servers={}, message_id=0, max_rounds=4)


def test_a_fallback_that_calls_tools_takes_the_answer_with_its_tools(alice, fake_backend):
    fake_backend.down = {ASKED}
    fall_back_to(WITH_TOOLS, WITHOUT_TOOLS)
    tools = runner()

    admitted = admit(alice, tools=tools)

    assert admitted.model == WITH_TOOLS
    assert admitted.task.tools is tools
    assert admitted.task.params.extra == {"tools": SPECS}
    assert admitted.task.cache_key is None


def test_a_fallback_that_cannot_call_tools_takes_the_answer_without_them(alice, fake_backend):
    fake_backend.down = {ASKED}
    fall_back_to(WITHOUT_TOOLS)

    admitted = admit(alice, tools=runner())

    assert admitted.model == WITHOUT_TOOLS
    assert admitted.task.tools is None
    assert "tools" not in admitted.task.params.extra


def test_an_api_request_for_tools_is_never_served_by_a_model_without_them(alice, fake_backend):
    fake_backend.down = {ASKED}
    fall_back_to(WITHOUT_TOOLS)

    # The client runs its own tools: a model that ignores them would not answer what it asked.
    with pytest.raises(EngineOverloaded, match="remote is down"):
        admit(alice, tools=None)


def test_a_fallback_taking_a_full_queues_answer_runs_its_tools_saved_with_that_answer(alice, fake_backend):
    fake_backend.full = {ASKED}
    fall_back_to(WITH_TOOLS)
    admitted = admit(alice, tools=runner())
    assert admitted.model == ASKED

    started = services.generation_submit(admitted, message_id=42)

    assert started.model == WITH_TOOLS
    [task] = fake_backend.submitted
    assert task.model == WITH_TOOLS
    assert isinstance(task.tools, ChatToolRunner)
    assert task.tools.message_id == 42
    assert task.params.extra == {"tools": SPECS}


def test_a_full_queues_answer_goes_on_without_tools_on_a_fallback_that_cannot_call_them(alice, fake_backend):
    fake_backend.full = {ASKED}
    fall_back_to(WITHOUT_TOOLS)

    started = services.generation_submit(admit(alice, tools=runner()), message_id=42)

    assert started.model == WITHOUT_TOOLS
    [task] = fake_backend.submitted
    assert task.tools is None
    assert "tools" not in task.params.extra
