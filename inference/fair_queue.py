"""The order in which waiting generations are taken: the one place that decides it.

By plan priority first (higher first), then round-robin across owners (users) within a
priority, then in arrival order. So one user with many waiting requests delays another
user's single request by at most one turn, whatever the order they arrived in.

Round-robin is kept as turns: each priority has a current turn (that of the last item
taken there) and remembers the turn each owner was last served in. An owner's waiting
items get consecutive turns from the first one it is due: the current turn, or the one
after its last service if that is later. Items are taken in (priority, turn, arrival)
order. An item withdrawn (cancelled) leaves no gap behind it: its owner's later items
move up a turn. Taking the first item never reorders the rest, so a place told to a
waiter only changes when an item arrives ahead of it or one ahead of it leaves.

With every item at the default priority and owner, the order is first come, first served.
Plain Python, no Django: the engine, the upstream pool and their tests share it.
"""

from __future__ import annotations

import bisect
import itertools
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
    """Waiting items; iterating, indexing and `popleft` follow the order they are taken in.

    Kept sorted as items come and go (a sorted list of keys beside the items), so that a
    queue of thousands costs a bisection per arrival, not a sort: the engine asks for
    places on every submission. Items are told apart by identity, not equality.
    """

    def __init__(self) -> None:
        self._order: list[W] = []  # in the order they are taken
        self._keys: list[tuple[int, int, int]] = []  # theirs, sorted: (-priority, turn, arrival)
        self._key: dict[int, tuple[int, int, int]] = {}  # by id(item)
        self._arrivals = itertools.count()
        self._turn: dict[int, int] = {}  # priority -> turn of the last item taken
        self._served: dict[tuple[int, str], int] = {}  # (priority, owner) -> turn last served
        self._last: dict[tuple[int, str], int] = {}  # (priority, owner) -> turn of its last waiting item

    def append(self, item: W) -> None:
        self._insert(item, next(self._arrivals))

    def remove(self, item: W) -> None:
        """Withdraw a waiting item (cancelled): it is not counted as its owner's turn."""
        del self._order[self.index(item)]
        del self._key[id(item)]
        # Its owner's later items each move up a turn: work every turn out again, by arrival.
        waiting = sorted(self._order, key=lambda other: self._key[id(other)][2])
        arrivals = [self._key[id(other)][2] for other in waiting]
        self._order, self._keys, self._key, self._last = [], [], {}, {}
        for other, arrival in zip(waiting, arrivals, strict=True):
            self._insert(other, arrival)

    def popleft(self) -> W:
        """Take the first item in order; its owner's next one waits for the next turn."""
        if not self._order:
            raise IndexError("popleft from an empty FairQueue")
        first, (_, turn, _) = self._order.pop(0), self._keys.pop(0)
        del self._key[id(first)]
        owner = (first.priority, first.owner)
        if self._last[owner] == turn:  # it was its owner's last one waiting
            del self._last[owner]
        self._turn[first.priority] = turn
        self._served[owner] = turn
        # Owners last served before the current turn are due at it anyway: forget them.
        self._served = {key: last for key, last in self._served.items() if last >= self._turn[key[0]]}
        return first

    def index(self, item: W) -> int:
        """How many are taken before `item`; ValueError if it is not waiting."""
        if id(item) not in self._key:
            raise ValueError("not in the queue")
        return bisect.bisect_left(self._keys, self._key[id(item)])

    def __getitem__(self, index: int) -> W:
        return self._order[index]

    def __iter__(self) -> Iterator[W]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, item: object) -> bool:
        return id(item) in self._key

    def _insert(self, item: W, arrival: int) -> None:
        owner = (item.priority, item.owner)
        if owner in self._last:  # the turn after its owner's last one waiting
            turn = self._last[owner] + 1
        else:  # the current turn, or the one after its owner's last service if that is later
            turn = max(self._turn.get(item.priority, 0), self._served.get(owner, -1) + 1)
        self._last[owner] = turn
        key = (-item.priority, turn, arrival)
        at = bisect.bisect(self._keys, key)
        self._keys.insert(at, key)
        self._order.insert(at, item)
        self._key[id(item)] = key
