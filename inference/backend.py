"""The one interface everything above the model talks to: a generation backend.

Views, consumers, the API, the ledger and housekeeping never know which backend runs a
generation: each produces the same numbered events in the stream store, so readers,
resume, Stop and usage work the same for all. Implementations (generation/backends/router.py):
the in-process engine and Celery workers; one is chosen once, at start-up.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from inference.generators import ChatTokenizer, GenerationParams, Prompt
from inference.tool_loop import ToolRunner


class LedgerVerdict:
    """The ledger's verdict on a generation that started before it was written (a backend's
    `starts_early`): the generation runs meanwhile, its end waits for the verdict before it
    is settled, and a grant below the max_tokens it went out with stops it there."""

    # Longer than any admission transaction; a verdict never given counts as a refusal.
    TIMEOUT_S = 60.0

    def __init__(self) -> None:
        self._given = threading.Event()
        self.max_tokens: int | None = None  # None until granted, and when refused

    def grant(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._given.set()

    def refuse(self) -> None:
        self._given.set()

    def granted(self) -> bool:
        """Wait for the verdict: whether the generation has a ledger record to settle."""
        return self._given.wait(self.TIMEOUT_S) and self.max_tokens is not None


@dataclass(frozen=True)
class GenerationTask:
    """A generation to run, as data: plain JSON, so that it can travel to a worker."""

    stream_id: str
    model: str
    prompt: Prompt
    params: GenerationParams
    # The chat answer it writes; None for API completions, which only have a usage record.
    message_id: int | None = None
    # Generations ahead of it when it was admitted, as told to its readers (None: none).
    ahead: int | None = None
    # The request that started it, named in its log line.
    request_id: str | None = None
    # Where its answer is kept once complete (the response cache); None: not kept.
    cache_key: str | None = None
    # Its place in the waiting order (inference/fair_queue.py): the plan's priority and the
    # user it is for.
    priority: int = 0
    owner: str = ""
    # Its prompt's tokens, as admission counted them (None: not counted yet).
    prompt_tokens: int | None = None
    # The answer rules that rewrite its text as it streams (guardrails' RuleSpec as JSON).
    answer_rules: tuple[dict[str, Any], ...] = ()
    # Set when it starts before its admission is written; never travels.
    admission: LedgerVerdict | None = field(default=None, compare=False)
    # Who runs its model's tool calls (a chat with tools, on a model server); never travels.
    tools: ToolRunner | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        data = asdict(replace(self, admission=None, tools=None))
        del data["tools"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GenerationTask:
        params = {**data["params"], "stop": tuple(data["params"]["stop"])}
        answer_rules = tuple(data.get("answer_rules", ()))  # a task queued before they were sent has none
        return cls(**{**data, "params": GenerationParams(**params), "answer_rules": answer_rules})


@dataclass(frozen=True)
class ModelLoad:
    """Where one model's generations stand, for metrics and the admin."""

    model: str
    scheduler: str
    ready: bool
    active: int
    queued: int
    max_concurrent: int
    generated_tokens: int
    # Its weights are in this process's memory now (CHAT_MODEL_IDLE_UNLOAD_S frees them while
    # idle); None where this process holds no model (a Celery web process, a model server).
    loaded: bool | None = None


@dataclass(frozen=True)
class DeploymentQueue:
    """One model's generations across the whole deployment, from the admission bound in
    Redis: every process sees the same figures (autoscaling, docs/scaling.md)."""

    model: str
    running: int
    waiting: int
    rows: int  # generations the live workers run at once

    @classmethod
    def of(cls, model: str, *, rows: int, admitted: int) -> DeploymentQueue:
        """Admitted generations fill the rows first; the rest wait."""
        return cls(model, running=min(rows, admitted), waiting=max(0, admitted - rows), rows=rows)


class GenerationBackend(Protocol):
    def models(self) -> list[str]:
        """The model names it serves; the first is the default."""
        ...

    def features(self, model: str) -> frozenset[str]:
        """The request fields beyond the common ones that `model` takes (e.g. "tools")."""
        ...

    def producer(self, model: str) -> str:
        """Who the ledger records as generating a run of `model` admitted now."""
        ...

    def count_prompt_tokens(self, model: str, prompt: Prompt) -> int:
        """The prompt's tokens, with the model's own tokenizer; EngineOverloaded while it loads."""
        ...

    def context_length(self, model: str) -> int:
        """Prompt and answer tokens the model holds; EngineOverloaded while it loads."""
        ...

    def tokenizer(self, model: str) -> ChatTokenizer | None:
        """The tokenizer that counts `model`'s prompts (/tokenize and /detokenize); None where
        there is no real one (the synthetic model, a model server's without one configured).
        EngineOverloaded while it loads."""
        ...

    def submit(self, task: GenerationTask) -> str:
        """Queue an admitted generation; its stream id. Raises EngineOverloaded (queue full)."""
        ...

    def starts_early(self, model: str) -> bool:
        """Whether a generation of `model` may be submitted before its admission is written,
        with a task.admission: true where nothing but the settling of its end needs the
        ledger record (not for workers, which claim their records)."""
        ...

    def ready(self) -> bool:
        """The default model can generate (for /readyz)."""
        ...

    def wait_ready(self, timeout: float | None = None) -> bool: ...

    def not_ready_reason(self) -> str:
        """Why it is not ready: "loading", or the load error."""
        ...

    def loads(self) -> list[ModelLoad]: ...

    def deployment_queues(self) -> list[DeploymentQueue]:
        """Its models' generations across the deployment where one bound admits them all
        (Celery workers); empty where each process knows only its own."""
        ...

    def start(self) -> None:
        """At server start: load the default model, begin housekeeping where it is due."""
        ...

    def shut_down(self, grace_s: float) -> None:
        """Refuse new generations; let those under way finish for up to `grace_s` seconds;
        end the rest as interrupted, their text kept (SIGTERM, GRACEFUL_TIMEOUT)."""
        ...

    def housekeep(self) -> None:
        """Give back what runs that ended without a word still hold (beat's reaping calls it)."""
        ...
