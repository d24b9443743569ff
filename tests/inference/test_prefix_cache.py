"""Prompts that begin as an earlier one did start from its keys and values (PrefixCache).

The real model answers each prompt as generate() does alone; the model is seen to run only
the tokens after the known beginning; one owner never starts from another's."""

from __future__ import annotations

import pytest
import torch

from inference.batching import Sequence, TransformersBatch, open_batch
from inference.generators import GenerationParams
from inference.prefix_cache import PrefixCache, common_length

MIB = 2**20


def kv(tokens: int, layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Stand-in keys and values of `tokens` tokens: (1, 1 head, tokens, 4) float32, 16 bytes a token each."""
    return [(torch.zeros(1, 1, tokens, 4), torch.zeros(1, 1, tokens, 4)) for _ in range(layers)]


def nbytes(tokens: int, layers: int = 2) -> int:
    return tokens * 32 * layers


# --- the cache alone ---


def test_common_length():
    assert common_length((1, 2, 3), [1, 2, 4]) == 2
    assert common_length((1, 2), [1, 2, 3]) == 2
    assert common_length((1, 2, 3), [1, 2]) == 2
    assert common_length((5,), [1]) == 0
    assert common_length((), [1]) == 0


def test_the_longest_shared_beginning_is_found_and_never_the_whole_prompt():
    cache = PrefixCache(MIB)
    short, long = kv(3), kv(6)
    cache.add("u", [1, 2, 3], short)
    cache.add("u", [1, 2, 9, 9, 9, 9], long)
    assert cache.longest("u", [1, 2, 9, 9, 7]) == (4, long)
    assert cache.longest("u", [1, 2, 3, 4]) == (3, short)
    # The same prompt again: every token but the last, which the model must run.
    assert cache.longest("u", [1, 2, 3])[0] == 2
    assert cache.longest("u", [7, 8]) == (0, [])
    assert cache.longest("u", [1]) == (0, [])


def test_an_owner_never_starts_from_another_owners_sequences_but_all_share_the_template():
    cache = PrefixCache(MIB)
    template, mine = kv(2), kv(5)
    cache.share([1, 2], template)
    cache.add("alice", [1, 2, 3, 4, 5], mine)
    assert cache.longest("alice", [1, 2, 3, 4, 5, 6]) == (5, mine)
    assert cache.longest("bob", [1, 2, 3, 4, 5, 6]) == (2, template)
    assert cache.longest("", [1, 2, 3, 4, 5, 6]) == (2, template)


def test_least_recently_used_sequences_leave_first_within_the_budget():
    cache = PrefixCache(nbytes(10))
    cache.add("u", [1, 1, 1, 1], kv(4))
    cache.add("u", [2, 2, 2, 2], kv(4))
    assert cache.longest("u", [1, 1, 1, 1, 5])[0] == 4  # used: [2 ...] is now the oldest
    cache.add("u", [3, 3, 3, 3], kv(4))
    assert cache.nbytes == nbytes(8)
    assert cache.longest("u", [2, 2, 2, 2, 5])[0] == 0
    assert cache.longest("u", [1, 1, 1, 1, 5])[0] == 4
    assert cache.longest("u", [3, 3, 3, 3, 5])[0] == 4


def test_a_sequence_larger_than_the_budget_or_a_budget_of_zero_keeps_nothing():
    cache = PrefixCache(nbytes(3))
    cache.add("u", [1, 2, 3, 4], kv(4))
    assert len(cache) == 0 and cache.nbytes == 0
    off = PrefixCache(0)
    off.share([1, 2], kv(2))
    off.add("u", [1, 2, 3], kv(3))
    assert len(off) == 0
    assert off.longest("u", [1, 2, 3, 4])[0] == 2  # the template's beginning is kept all the same


def test_a_conversation_keeps_one_entry_its_longest():
    """Each turn extends the last: the shorter entry goes; a shorter one held by a longer is not added."""
    cache = PrefixCache(MIB)
    cache.add("u", [1, 2, 3], kv(3))
    cache.add("u", [1, 2, 3, 4, 5], kv(5))
    assert len(cache) == 1 and cache.nbytes == nbytes(5)
    cache.add("u", [1, 2, 3], kv(3))
    assert len(cache) == 1 and cache.nbytes == nbytes(5)
    cache.add("other", [1, 2, 3], kv(3))  # another owner's is its own
    assert len(cache) == 2


# --- the real model ---


def chat(*turns: str) -> list[dict[str, str]]:
    roles = ("user", "assistant")
    return [{"role": roles[index % 2], "content": text} for index, text in enumerate(turns)]


def greedy(max_tokens: int) -> GenerationParams:
    return GenerationParams(max_tokens=max_tokens, temperature=0)


def alone(smollm, prompt, max_tokens: int) -> str:
    pieces: list[str] = []
    smollm.generate(prompt, greedy(max_tokens), pieces.append, lambda: False)
    return "".join(pieces)


def run(batch, requests: list[tuple[str, list[dict[str, str]] | str]], max_tokens: int) -> list[str]:
    """Each (owner, prompt) joins the batch at once; their answers when all finished."""
    texts: list[list[str]] = [[] for _ in requests]
    for (owner, prompt), pieces in zip(requests, texts, strict=True):
        batch.add(Sequence(prompt, greedy(max_tokens), pieces.append, lambda: False, owner))
    while len(batch):
        batch.step()
    return ["".join(pieces) for pieces in texts]


@pytest.fixture
def prefilled(smollm, monkeypatch):
    """The tokens each prefill's forward pass ran, per row (seen by the model: the real
    tokens among its inputs)."""
    runs: list[list[int]] = []
    prefilling: list[bool] = []

    def record(module, args, kwargs):
        if prefilling:
            input_ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
            runs.append(mask[:, -input_ids.shape[1] :].sum(dim=1).tolist())

    prefill_rows = TransformersBatch._prefill_rows

    def watched(self, *args):
        prefilling.append(True)
        try:
            return prefill_rows(self, *args)
        finally:
            prefilling.pop()

    monkeypatch.setattr(TransformersBatch, "_prefill_rows", watched)
    handle = smollm.model.register_forward_pre_hook(record, with_kwargs=True)
    yield runs
    handle.remove()


@pytest.mark.parametrize("cuda_graphs", ["0", "1"], ids=["dynamic", "static"])
def test_a_chats_next_turn_runs_only_its_new_message_and_answers_as_alone(smollm, prefilled, cuda_graphs):
    batch = open_batch(smollm, cuda_graphs=cuda_graphs, max_rows=4, row_tokens=512, prefix_cache_bytes=64 * MIB)
    first = chat("What is the capital of France?")
    [answer] = run(batch, [("alice", first)], 24)
    assert answer == alone(smollm, first, 24)

    second = chat("What is the capital of France?", answer, "And of Italy?")
    prefilled.clear()
    [next_answer] = run(batch, [("alice", second)], 24)

    assert next_answer == alone(smollm, second, 24)
    whole = len(smollm.encode(second)["input_ids"][0])
    [[ran]] = prefilled
    # The new message, the template's turn markers around it, and the previous answer's
    # last token (sampled, never run): a handful of tokens of the prompt's whole.
    assert ran <= 16 < whole - 40, (ran, whole)
    assert len(batch.prefixes) == 1  # the conversation's longest sequence replaced the first turn's


def test_another_owners_same_prompt_runs_whole_after_the_templates_opening(smollm, prefilled):
    batch = open_batch(smollm, prefix_cache_bytes=64 * MIB)
    prompt = chat("Write a haiku about the sea.")
    run(batch, [("alice", prompt)], 8)
    whole = len(smollm.encode(prompt)["input_ids"][0])
    opening = len(smollm.template_prefix())
    prefilled.clear()

    run(batch, [("bob", prompt)], 8)
    run(batch, [("alice", prompt)], 8)

    assert prefilled == [[whole - opening], [1]]


def test_prompts_starting_from_different_beginnings_join_in_one_step_and_answer_as_alone(smollm, prefilled):
    """A long conversation's next turn, a fresh chat, a raw prompt (no template) and a chat
    of its own system prompt are prefilled together, each after what is known of it."""
    batch = open_batch(smollm, prefix_cache_bytes=64 * MIB)
    history = chat("Explain photosynthesis in two sentences.")
    [answer] = run(batch, [("carol", history)], 32)
    prompts = [
        ("carol", chat("Explain photosynthesis in two sentences.", answer, "Shorter, please.")),
        ("dave", chat("Why is the sky blue?")),
        ("dave", "The three primary colours are"),
        ("erin", [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Hello!"}]),
    ]
    prefilled.clear()
    answers = run(batch, prompts, 16)
    assert len(prefilled) == 1  # one forward pass for the four
    for (_, prompt), got in zip(prompts, answers, strict=True):
        assert got == alone(smollm, prompt, 16)


def test_without_a_budget_only_the_templates_opening_is_reused(smollm, prefilled):
    batch = open_batch(smollm)
    prompt = chat("Why is the sky blue?")
    run(batch, [("alice", prompt)], 8)
    prefilled.clear()
    run(batch, [("alice", prompt)], 8)
    assert len(batch.prefixes) == 0
    assert prefilled == [[len(smollm.encode(prompt)["input_ids"][0]) - len(smollm.template_prefix())]]


def test_a_model_with_sliding_window_layers_keeps_no_sequences(smollm, monkeypatch):
    """Such a layer keeps only its window's last tokens: no beginning of them is whole."""
    monkeypatch.setattr(smollm.model.config, "layer_types", ["sliding_attention", "full_attention"], raising=False)
    assert open_batch(smollm, prefix_cache_bytes=64 * MIB).prefixes.budget_bytes == 0
    monkeypatch.setattr(smollm.model.config, "layer_types", ["full_attention"] * 2)
    assert open_batch(smollm, prefix_cache_bytes=64 * MIB).prefixes.budget_bytes == 64 * MIB
