"""Keys and values of token sequences the model has run, for prompts that begin the same way.

A chat's next turn sends the whole conversation again: its prompt begins, token for token,
with the previous turn's prompt and answer. Regenerating an answer, or an API client that
sends one long system prompt with every request, repeat a prompt's beginning the same way.
On a CPU the prefill is bound by arithmetic, so a prompt that starts from the keys and
values of the tokens it shares with an earlier one runs only the rest: a long
conversation's next answer starts in the time its new message takes, not the whole
history's (what vLLM's prefix caching and llama.cpp's prompt cache do).

Entries are kept per owner (a user): a prompt starts only from its own owner's entries and
from the chat template's usual beginning, which every prompt shares. How fast an answer
starts never tells one user what another asked (vLLM's `cache_salt` for the same reason).
When a new entry would pass the budget, the least recently used ones go first.

No Django, no torch import: the tensors come from the batch.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

# Per layer, the keys and values of one sequence: (1, heads, tokens, head_dim) each.
LayerKV = list[tuple[Any, Any]]


@dataclass(eq=False)
class _Entry:
    ids: tuple[int, ...]
    kv: LayerKV
    nbytes: int


def common_length(first: tuple[int, ...], second: list[int] | tuple[int, ...]) -> int:
    """How many tokens two sequences share from their start."""
    return next(
        (index for index, (a, b) in enumerate(zip(first, second, strict=False)) if a != b), min(len(first), len(second))
    )


class PrefixCache:
    """The sequences a batch has run, by owner, within `budget_bytes` of keys and values
    (0: none are kept), and the chat template's beginning, which is always kept."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.nbytes = 0
        self._shared: _Entry | None = None
        self._entries: OrderedDict[tuple[str, tuple[int, ...]], _Entry] = OrderedDict()  # least recently used first

    def __len__(self) -> int:
        return len(self._entries)

    def share(self, ids: list[int], kv: LayerKV) -> None:
        """Keep the beginning every prompt may start from (outside the budget)."""
        self._shared = _Entry(tuple(ids), kv, 0)

    def longest(self, owner: str, ids: list[int]) -> tuple[int, LayerKV]:
        """How many of `ids`' first tokens have known keys and values, and the entry
        holding them (its first that many columns are theirs; no entry: 0 and []).

        Never all of `ids`: the model runs at least the last token, whose logits give
        the answer's first."""
        best: _Entry | None = None
        length = 0
        candidates = [self._shared] if self._shared else []
        candidates += [entry for (entry_owner, _), entry in self._entries.items() if entry_owner == owner]
        for entry in candidates:
            shared = min(common_length(entry.ids, ids), len(ids) - 1)
            if shared > length:
                best, length = entry, shared
        if best is None:
            return 0, []
        if best is not self._shared:
            self._entries.move_to_end((owner, best.ids))
        return length, best.kv

    def add(self, owner: str, ids: list[int], kv: LayerKV) -> None:
        """Keep `kv`, the keys and values of `ids` (tensors nobody else writes to), for
        `owner`'s later prompts. An entry it extends goes; an entry that already holds
        all of it is kept instead."""
        key = (owner, tuple(ids))
        nbytes = sum(keys.nbytes + values.nbytes for keys, values in kv)
        if not ids or nbytes > self.budget_bytes:
            return
        for entry_key, entry in list(self._entries.items()):
            if entry_key[0] != owner:
                continue
            shared = common_length(entry.ids, key[1])
            if shared == len(key[1]):  # already held, by this entry or a longer one
                self._entries.move_to_end(entry_key)
                return
            if shared == len(entry.ids):  # the new one holds all of this one
                self._drop(entry_key)
        self._entries[key] = _Entry(key[1], kv, nbytes)
        self.nbytes += nbytes
        while self.nbytes > self.budget_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: tuple[str, tuple[int, ...]]) -> None:
        self.nbytes -= self._entries.pop(key).nbytes
