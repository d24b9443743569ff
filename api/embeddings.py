"""How embeddings read in OpenAI's format: a list of embedding objects, with usage."""

from __future__ import annotations

import base64
from typing import Any, Literal

from inference.embedding import Embeddings, vector_bytes


def embedding_list(made: Embeddings, *, model: str, encoding_format: Literal["float", "base64"]) -> dict[str, Any]:
    """OpenAI's answer to /v1/embeddings: each vector as numbers, or as the base64 of its
    float32 little-endian bytes (what the `openai` client asks for by default, and decodes)."""
    return {
        "object": "list",
        "data": [
            {
                "object": "embedding",
                "index": index,
                "embedding": (
                    base64.b64encode(vector_bytes(vector)).decode("ascii")
                    if encoding_format == "base64"
                    else vector.tolist()
                ),
            }
            for index, vector in enumerate(made.vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": made.total_tokens, "total_tokens": made.total_tokens},
    }
