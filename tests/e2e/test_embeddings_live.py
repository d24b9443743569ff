"""POST /v1/embeddings through the official openai client and LangChain's OpenAIEmbeddings
against a real daphne.

OpenAIEmbeddings sends token ids unless told `check_embedding_ctx_length=False`, and those
are refused (tests/api/test_embeddings.py).
"""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest
from langchain_openai import OpenAIEmbeddings
from pydantic import SecretStr

from inference.embedding import available_embedding_models
from tests.support.livesite import LiveSite, unlimited_api_key

pytestmark = pytest.mark.skipif(
    "all-minilm-l6-v2" not in available_embedding_models(), reason="the embedding model's package is not installed"
)

# The fuzzer's site (the synthetic chat model): one site started for both modules.
SITE_ENV = {"CHAT_ENABLE_SYNTHETIC": "1", "CHAT_MODEL": "synthetic", "CHAT_SYNTHETIC_TOKENS_PER_S": "20000"}
EMBEDDER = "all-minilm-l6-v2"
TEXTS = ["A man is eating food.", "A man is eating a piece of bread.", "The sky is blue."]


@pytest.fixture(scope="module")
def site(live_sites) -> LiveSite:
    return live_sites.site(SITE_ENV)


@pytest.fixture(scope="module")
def client(site) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{site.base_url}/v1", api_key=unlimited_api_key(site), max_retries=0)


def test_the_openai_client_gets_vectors_in_base64_its_default_and_as_floats(client):
    packed = client.embeddings.create(model=EMBEDDER, input=TEXTS)  # the client asks for base64 and decodes it
    floats = client.embeddings.create(model=EMBEDDER, input=TEXTS, encoding_format="float")

    assert packed.model == floats.model == EMBEDDER
    assert [item.index for item in packed.data] == [0, 1, 2]
    assert packed.usage.prompt_tokens == packed.usage.total_tokens == floats.usage.total_tokens > 0
    a = np.array([item.embedding for item in packed.data])
    b = np.array([item.embedding for item in floats.data])
    assert a.shape == (3, 384)
    assert np.allclose(a, b, atol=1e-6)
    assert a[0] @ a[1] > a[0] @ a[2]  # eating and bread are nearer than eating and the sky


def test_one_string_and_the_models_dimensions(client):
    made = client.embeddings.create(model=EMBEDDER, input="hello", dimensions=384, encoding_format="float")

    assert len(made.data) == 1 and len(made.data[0].embedding) == 384


def test_the_client_raises_its_errors_for_refusals(client):
    with pytest.raises(openai.BadRequestError) as wrong_size:
        client.embeddings.create(model=EMBEDDER, input="hello", dimensions=256)
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="text-embedding-3-small", input="hello")

    assert wrong_size.value.body["param"] == "dimensions"  # type: ignore[index]


def test_models_list_names_the_embedding_model_with_its_kind(client):
    models = {model.id: model for model in client.models.list()}

    assert models[EMBEDDER].model_extra == {"kind": "embedding"}
    assert models["synthetic"].model_extra == {"kind": "chat"}


def test_langchains_openai_embeddings_gets_unit_vectors_and_is_billed(site):
    key = unlimited_api_key(site)  # a key of its own: the ledger holds this test's requests only
    embedder = OpenAIEmbeddings(
        model=EMBEDDER,
        base_url=f"{site.base_url}/v1",
        api_key=SecretStr(key),
        # Its default counts tokens with tiktoken, which downloads its encodings from the
        # internet (out of reach here), and then sends token ids, which chatsite refuses.
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    query = "Someone is having a meal."

    documents = np.array(embedder.embed_documents(TEXTS))
    asked = np.array(embedder.embed_query(query))

    assert documents.shape == (3, 384) and asked.shape == (384,)
    assert np.allclose(np.linalg.norm(documents, axis=1), 1, atol=1e-5)
    assert np.isclose(np.linalg.norm(asked), 1, atol=1e-5)
    assert asked @ documents[0] > asked @ documents[2]  # the paraphrase is nearer than the sky
    used = httpx.get(f"{site.base_url}/v1/usage", headers={"Authorization": f"Bearer {key}"}).json()
    same_texts = openai.OpenAI(base_url=f"{site.base_url}/v1", api_key=key, max_retries=0).embeddings.create(
        model=EMBEDDER, input=[*TEXTS, query]
    )
    assert used["requests"]["used"] == 2
    assert used["tokens"]["used"] == same_texts.usage.total_tokens > 0
