"""An engine's model in memory, or not: loaded at start, freed after a while with nothing
to do (CHAT_MODEL_IDLE_UNLOAD_S), by an operator ("unload now"), or to make room for another
(CHAT_MAX_LOADED_MODELS), loaded again by the next generation, once however many wait for
it. No Django imports here.

While the model is out of memory its tokenizer stays: prompts are still counted (and
refused when they don't fit) before they queue.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from inference.generators import ChatTokenizer, Generator

logger = logging.getLogger(__name__)


class Residency(StrEnum):
    LOADING = "loading"  # the first load, at start
    LOADED = "loaded"
    FAILED = "failed"  # the first load failed: the engine never serves
    UNLOADED = "unloaded"  # freed while idle; the next generation loads it again
    RELOADING = "reloading"


class ModelNotLoaded(RuntimeError):
    pass


def tokenizer_of(generator: Generator) -> ChatTokenizer | Generator:
    """What counts a model's prompt tokens without its weights: a transformers model's
    tokenizer; any other generator (the synthetic model) holds no weights and stays whole."""
    if isinstance(generator, ChatTokenizer):
        return ChatTokenizer(generator.name, generator.tokenizer, generator.context_length)
    return generator


def free_memory() -> None:
    """Hand freed tensors back: collect cycles, empty torch's CUDA cache where torch runs,
    and trim the C heap (glibc keeps freed small blocks: 36 MiB of them here, after SmolLM2).

    torch is only looked up, never imported: a process that never imported it holds no
    CUDA memory."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):  # not glibc (e.g. musl)
            ctypes.CDLL("libc.so.6").malloc_trim(0)


class ResidentModel:
    """The generator of one engine, loaded by `load`, through the states of `Residency`.

    `acquire()` gives the generator, loading it first where it was unloaded: the first
    caller loads, the others wait for that load and share its outcome. `release()` lets
    it go (the engine decides when: it alone knows that nothing runs or waits).
    `on_loaded` is told how many seconds each load took; `on_reload_failed` is called when
    a reload failed, before the next one can start, to end what waited for it.
    """

    def __init__(
        self,
        load: Callable[[], Generator],
        *,
        on_loaded: Callable[[float], None] | None = None,
        on_reload_failed: Callable[[str], None] | None = None,
    ) -> None:
        self._load = load
        self._on_loaded = on_loaded
        self._on_reload_failed = on_reload_failed
        self.state = Residency.LOADING
        self.generator: Generator | None = None
        # What counts prompt tokens: the generator, or while unloaded its tokenizer.
        self.tokenizer: ChatTokenizer | Generator | None = None
        self.error: str | None = None
        self.loaded_at = time.monotonic()  # when the last load ended
        self._changed = threading.Condition()
        self._first_load_ended = threading.Event()

    @property
    def ready(self) -> bool:
        """It serves: loaded, or out of memory but loadable (no load of it failed since)."""
        if self.state == Residency.LOADED:
            return True
        return self.state in (Residency.UNLOADED, Residency.RELOADING) and self.error is None

    def thread(self) -> threading.Thread:
        """The (unstarted) thread of the first load."""
        return threading.Thread(target=self._first_load, name="chatsite-load-model", daemon=True)

    def wait_first_load(self, timeout: float | None = None) -> bool:
        """Wait until the first load ended, well or not; whether it did within `timeout`."""
        return self._first_load_ended.wait(timeout)

    def _first_load(self) -> None:
        self._load_now(Residency.FAILED)
        self._first_load_ended.set()

    def acquire(self) -> Generator:
        """The generator, loaded here first if it was freed; ModelNotLoaded if it can't be."""
        with self._changed:
            if self.state in (Residency.LOADING, Residency.RELOADING):
                while self.state in (Residency.LOADING, Residency.RELOADING):
                    self._changed.wait()
                if self.state != Residency.LOADED:  # the load waited for failed: so does this
                    raise ModelNotLoaded(f"the model is not loaded ({self.error})")
            if self.state == Residency.LOADED:
                assert self.generator is not None
                return self.generator
            if self.state == Residency.FAILED:
                raise ModelNotLoaded(f"the model is not loaded ({self.error})")
            self.state = Residency.RELOADING
        # A failed reload leaves it unloaded: the next generation tries again.
        self._load_now(Residency.UNLOADED)
        if self.generator is None:
            raise ModelNotLoaded(f"the model is not loaded ({self.error})")
        return self.generator

    def _load_now(self, on_failure: Residency) -> None:
        started = time.monotonic()
        try:
            generator = self._load()
        except Exception as error:
            logger.exception("The model failed to load")
            self.error = f"{type(error).__name__}: {error}"
            if on_failure == Residency.UNLOADED and self._on_reload_failed is not None:
                self._on_reload_failed(self.error)  # still reloading: what joins now fails with it
            with self._changed:
                self.state = on_failure
                self._changed.notify_all()
            return
        took = time.monotonic() - started
        with self._changed:
            self.generator = self.tokenizer = generator
            self.error = None
            self.state = Residency.LOADED
            self.loaded_at = time.monotonic()
            self._changed.notify_all()
        if self._on_loaded is not None:
            try:
                self._on_loaded(took)
            except Exception:
                logger.exception("Could not record the model's load time")

    def release(self) -> Generator | None:
        """Let the generator go (its tokenizer stays), and return it for the caller to drop
        outside its locks; None unless it was loaded. The caller calls free_memory() after."""
        with self._changed:
            if self.state != Residency.LOADED:
                return None
            generator, self.generator = self.generator, None
            assert generator is not None
            self.tokenizer = tokenizer_of(generator)
            self.state = Residency.UNLOADED
            return generator


@dataclass(frozen=True)
class ResidencyOrders:
    """What operators say of a model, read by every process that runs it: keep it in memory
    (the admin's "keep warm", or a plan that pins it), and how many times "unload now" was
    asked; a process unloads once for each rise of `unloads` it sees."""

    keep_warm: bool = False
    unloads: int = 0


class Evictable(Protocol):
    """An engine, as ModelBudget sees it."""

    @property
    def holds_memory(self) -> bool:
        """Its model is in memory, or being loaded into it."""
        ...

    @property
    def keep_warm(self) -> bool: ...

    @property
    def last_used(self) -> float:
        """When it last took or ended a job, or loaded its model (time.monotonic())."""
        ...

    def unload_if_idle(self) -> bool:
        """Free the model now unless something runs or waits; whether it did."""
        ...


class ModelBudget:
    """At most `max_loaded` models in this process's memory (CHAT_MAX_LOADED_MODELS; 0: any
    number): before a model loads, the least recently used idle one not kept warm leaves.

    Where every loaded model is busy or kept warm, the load goes ahead over the limit (with
    a warning): refusing it would fail requests the operator let in, and freeing a model in
    use would break its streams."""

    def __init__(self, max_loaded: int = 0) -> None:
        self.max_loaded = max_loaded
        self._members: list[Evictable] = []
        # Held while a model makes room: two loads at once can't both take the last place.
        self._lock = threading.Lock()

    def join(self, member: Evictable) -> None:
        with self._lock:
            self._members.append(member)

    def make_room(self, loading: Evictable) -> None:
        """Unload others until `loading` fits, least recently used first."""
        if not self.max_loaded:
            return
        with self._lock:
            while True:
                held = [m for m in self._members if m is not loading and m.holds_memory]
                if len(held) < self.max_loaded:
                    return
                idle = sorted((m for m in held if not m.keep_warm), key=lambda m: m.last_used)
                if not any(m.unload_if_idle() for m in idle):
                    logger.warning(
                        "%d models are in memory (CHAT_MAX_LOADED_MODELS=%d), none of them idle and "
                        "unpinned: loading one more over the limit",
                        len(held),
                        self.max_loaded,
                    )
                    return
