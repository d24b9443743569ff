from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from inference.embedding import Embedder, Embeddings

_remembered: dict[tuple[str, str, bool], tuple[np.ndarray, int]] = {}


@pytest.fixture(autouse=True)
def embeddings_remembered(monkeypatch) -> Iterator[None]:
    """The same texts (the test corpus, again for every test) are embedded once a session:
    the vectors are the model's all the same, and the tests take seconds, not minutes."""
    embed = Embedder.embed

    def remembered(self: Embedder, texts: list[str], *, truncate: bool = False) -> Embeddings:
        missing = [text for text in dict.fromkeys(texts) if (self.name, text, truncate) not in _remembered]
        if missing:
            made = embed(self, missing, truncate=truncate)
            for text, vector, tokens in zip(missing, made.vectors, made.tokens, strict=True):
                _remembered[self.name, text, truncate] = (vector, tokens)
        found = [_remembered[self.name, text, truncate] for text in texts]
        vectors = np.stack([vector for vector, _ in found]) if found else np.zeros((0, self.dimensions), np.float32)
        return Embeddings(vectors.astype(np.float32), [tokens for _, tokens in found])

    monkeypatch.setattr(Embedder, "embed", remembered)
    yield
