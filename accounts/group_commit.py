"""Many threads' small writes in one transaction: a burst of admissions commits together.

Each admission (accounts.services.usage_admit) is a short transaction: lock the account,
count, insert one usage record. In a burst, beginning and committing each one alone
costs more than its work, and on SQLite every writer waits for the one before it. Here
the first caller to arrive becomes the leader: it takes every call waiting at that
moment and runs them, one after the other, inside one transaction, each in a savepoint
of its own; then it hands the lead to a caller that arrived meanwhile, if any, and
returns. Each call sees the ones before it in its batch, so limits stay exact; a call
that raises (a refusal, or a database error in its savepoint) fails alone. Only a
failed commit fails the whole batch, every call with the same error.

A caller already inside a transaction runs its call alone, in that transaction: its
writes must commit or roll back with the rest of its work, not with a batch's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial, wraps
from typing import Generic, ParamSpec, TypeVar

from django.db import transaction

T = TypeVar("T")
P = ParamSpec("P")


@dataclass
class _Call(Generic[T]):
    work: Callable[[], T]
    woken: threading.Event = field(default_factory=threading.Event)
    leads: bool = False
    finished: bool = False
    result: T | None = None
    error: BaseException | None = None

    def outcome(self) -> T:
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]


class GroupCommit(Generic[T]):
    """Runs calls from many threads in shared transactions (see the module's docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[_Call[T]] = []
        self._leading = False
        self.batches = 0  # transactions run, for tests and benchmarks

    def grouped(self, work: Callable[P, T]) -> Callable[P, T]:
        """`work` as a function whose every call runs through `run`."""

        @wraps(work)
        def call(*args: P.args, **kwargs: P.kwargs) -> T:
            return self.run(partial(work, *args, **kwargs))

        return call

    def run(self, work: Callable[[], T]) -> T:
        if transaction.get_connection().in_atomic_block:
            return work()
        call = _Call(work)
        with self._lock:
            self._waiting.append(call)
            if not self._leading:
                self._leading = call.leads = True
        while not call.finished:
            if call.leads:
                self._lead()
            else:
                call.woken.wait()
                call.woken.clear()
        return call.outcome()

    def _lead(self) -> None:
        with self._lock:
            batch, self._waiting = self._waiting, []
        try:
            self._run_batch(batch)
        finally:
            with self._lock:
                if self._waiting:  # the next batch is led by one of its own callers
                    successor = self._waiting[0]
                    successor.leads = True
                    successor.woken.set()
                else:
                    self._leading = False

    def _run_batch(self, batch: list[_Call[T]]) -> None:
        self.batches += 1
        try:
            with transaction.atomic():
                for call in batch:
                    try:
                        with transaction.atomic():  # a savepoint: a failed call undoes only its own writes
                            call.result = call.work()
                    except Exception as error:
                        call.error = error
        except BaseException as error:  # the commit failed: nothing of the batch was written
            for call in batch:
                call.result, call.error = None, error
            raise
        finally:
            for call in batch:
                call.finished = True
                call.woken.set()
