"""The embedding core (inference/embedding.py): the packaged model, batching, the token
limit, and reciprocal rank fusion."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from inference.embedding import (
    EMBEDDING_MODELS,
    InputTooLong,
    available_embedding_models,
    embedder_for,
    reciprocal_rank_fusion,
    vector_bytes,
    vectors_of,
)

installed = pytest.mark.skipif(
    "all-minilm-l6-v2" not in available_embedding_models(), reason="the embedding model's package is not installed"
)


def test_rrf_puts_what_both_rankings_rank_high_first_and_keeps_the_first_rankings_order_on_ties():
    assert reciprocal_rank_fusion([[1, 2, 3], [3, 4, 1]]) == [1, 3, 2, 4]
    assert reciprocal_rank_fusion([[5, 6], []]) == [5, 6]
    assert reciprocal_rank_fusion([[], [7]]) == [7]
    assert reciprocal_rank_fusion([[1], [2]]) == [1, 2]  # a tie: the words' ranking first


def test_vectors_travel_as_float32_little_endian_bytes():
    matrix = np.array([[0.5, -0.25, 1.0], [0.0, 2.0, -1.5]], dtype=np.float32)

    blobs = [vector_bytes(row) for row in matrix]

    assert blobs[0] == np.array([0.5, -0.25, 1.0], dtype="<f4").tobytes()
    assert np.array_equal(vectors_of(blobs, 3), matrix)
    assert vectors_of([], 3).shape == (0, 3)


@installed
def test_the_packaged_model_is_found_without_importing_its_package():
    location = EMBEDDING_MODELS["all-minilm-l6-v2"].locate()
    assert location is not None and (location / "model.safetensors").exists()


@installed
def test_an_input_over_the_token_limit_is_refused_unless_truncation_is_asked_for():
    embedder = embedder_for("all-minilm-l6-v2", device="cpu")
    long = "word " * 400

    with pytest.raises(InputTooLong) as refused:
        embedder.embed(["short", long])
    cut = embedder.embed([long], truncate=True)

    assert (refused.value.index, refused.value.limit) == (1, 256)
    assert cut.tokens == [256]
    assert cut.vectors.shape == (1, 384)


@installed
def test_inputs_embedded_together_from_many_threads_get_the_vectors_they_get_alone():
    embedder = embedder_for("all-minilm-l6-v2", device="cpu")
    texts = [f"Sentence number {n} is {'short' if n % 2 else 'a little longer than the others'}." for n in range(12)]
    alone = [embedder.embed([text]).vectors[0] for text in texts]
    together: dict[int, np.ndarray] = {}

    def run(n: int) -> None:
        together[n] = embedder.embed([texts[n]]).vectors[0]

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(texts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    for n, vector in enumerate(alone):
        assert np.allclose(together[n], vector, atol=1e-5)
        assert abs(np.linalg.norm(vector) - 1) < 1e-5
