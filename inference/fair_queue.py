"""The order in which waiting generations are taken: the one place that decides it.

By plan priority first (higher first), then round-robin across owners (users) within a
priority, then in arrival order. So one user with many waiting requests delays another
user's single request by at most one turn, whatever the order they arrived in.

Round-robin is kept as turns: each priority has a current turn (that of the last item
taken there) and remembers the turn each owner was last served in. An owner's waiting
items get consecutive turns from the first one it is due: the current turn, or the one
after its last service if that is later. Items are taken in (priority, turn, arrival)
order. Turns are worked out afresh from the items waiting now, so an item withdrawn
(cancelled) leaves no gap behind it, and taking the first item never reorders the rest:
a place told to a waiter only changes when an item arrives ahead of it or leaves.

With every item at the default priority and owner, the order is first come, first served.
Plain Python, no Django: the engine, the upstream pool and their tests share it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar


class Waiter(Protocol):
    @property
    def priority(self) -> int:
        """Higher is taken first."""
        ...

    @property
    def owner(self) -> str:
        """Whose it is (a user): items of one owner take turns with those of the others."""
        ...


W = TypeVar("W", bound=Waiter)


class FairQueue(Generic[W]):
    """Waiting items; iterating, indexing and `popleft` follow the order they are taken in."""

    def __init__(self) -> None:
        self._arrived: list[W] = []  # in arrival order
        self._order: list[W] | None = None  # the taking order, worked out when asked for
        self._turn: dict[int, int] = {}  # priority -> turn of the last item taken
        self._served: dict[tuple[int, str], int] = {}  # (priority, owner) -> turn last served

    def append(self, item: W) -> None:
        self._arrived.append(item)
        self._order = None

    def remove(self, item: W) -> None:
        """Withdraw a waiting item (cancelled): it is not counted as its owner's turn."""
        self._arrived.remove(item)
        self._order = None

    def popleft(self) -> W:
        """Take the first item in order; its owner's next one waits for the next turn."""
        if not self._arrived:
            raise IndexError("popleft from an empty FairQueue")
        first = self._ordered()[0]
        turn = self._turns()[id(first)]
        self._arrived.remove(first)
        self._turn[first.priority] = turn
        self._served[(first.priority, first.owner)] = turn
        # Owners last served before the current turn are due at it anyway: forget them.
        self._served = {key: last for key, last in self._served.items() if last >= self._turn[key[0]]}
        self._order = None
        return first

    def index(self, item: W) -> int:
        """How many are taken before `item`."""
        return self._ordered().index(item)

    def __getitem__(self, index: int) -> W:
        return self._ordered()[index]

    def __iter__(self) -> Iterator[W]:
        return iter(self._ordered())

    def __len__(self) -> int:
        return len(self._arrived)

    def __contains__(self, item: object) -> bool:
        return item in self._arrived

    def _turns(self) -> dict[int, int]:
        """Each waiting item's turn, by id."""
        turns: dict[int, int] = {}
        next_turn: dict[tuple[int, str], int] = {}
        for item in self._arrived:
            key = (item.priority, item.owner)
            if key not in next_turn:
                next_turn[key] = max(self._turn.get(item.priority, 0), self._served.get(key, -1) + 1)
            turns[id(item)] = next_turn[key]
            next_turn[key] += 1
        return turns

    def _ordered(self) -> list[W]:
        if self._order is None:
            turns = self._turns()
            # sorted() is stable and _arrived is in arrival order: ties keep arrival order.
            self._order = sorted(self._arrived, key=lambda item: (-item.priority, turns[id(item)]))
        return self._order
