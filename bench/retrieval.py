"""Retrieval time over 10,000 passages, on the database in use.

    python -m bench.retrieval [--passages 10000] [--queries 300]
    DATABASE_URL=postgres://USER@HOST:5432/NAME python -m bench.retrieval

One conversation holds documents that split into `--passages` passages (about 200 words
each, drawn from a Zipf-distributed vocabulary of about 21,000 words ranked as in English:
the common words that questions leave out first, then the test corpus's other words, then
made-up ones; so the next most common words are in most passages and rare ones in a few).
Each query is a question made of four words of a random passage and some common English;
timed is `documents.services.retrieval_for`, all of it: finding the conversation's
documents, the full-text search, embedding the question with the packaged model, the
vector search, their fusion, loading the passages and writing the prompt. Target:
p95 ≤ 50 ms.

The passages' vectors: embedding 10,000 passages of made-up words takes tens of minutes on
two cores and means nothing, so each passage gets the real vector of one of 256 of them
(embedded by the model) plus a little noise, normalised: the vector search reads and
compares every vector of the conversation all the same, and questions find neighbours
in a realistic range of similarity. `--embed-all` embeds every passage instead.

Quality first (`quality`): the test corpus (tests/documents/corpus.py) in a conversation of
its own; for its 20 questions and its 20 paraphrases (questions that share no searchable
word with their document), how many have their document among the top 3 sources, by
words alone (the full-text search) and hybrid (words and meaning fused).

SQLite: a fresh database file in a temporary directory (FTS5). PostgreSQL: Django's test
database of DATABASE_URL's (`test_<NAME>`), created for the run and dropped after it; the
passages table is analysed after filling, as autovacuum would do.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results"
PARAGRAPH_WORDS = 160  # packs into one passage of at most 200 words, 40 shared with the next
PARAGRAPHS_PER_DOCUMENT = 200
QUESTION_PADDING = ["what", "does", "the", "say", "about", "and", "why"]


def vocabulary(rng: random.Random) -> list[str]:
    """Words by rank, as English has them: the common words that questions drop first, then
    the corpus's other words in random order, then made-up words for the long tail."""
    from documents.search import COMMON_WORDS
    from tests.documents.corpus import DOCUMENTS

    english = sorted({word.lower().strip(".,;:()") for text in DOCUMENTS.values() for word in text.split()})
    others = [word for word in english if word.isalpha() and word not in COMMON_WORDS]
    rng.shuffle(others)
    return [*sorted(COMMON_WORDS), *others, *(f"term{n}" for n in range(20_000))]


def document_text(rng: random.Random, words: list[str], weights: list[float]) -> str:
    drawn = rng.choices(words, cum_weights=weights, k=PARAGRAPH_WORDS * PARAGRAPHS_PER_DOCUMENT)
    return "\n\n".join(
        " ".join(drawn[start : start + PARAGRAPH_WORDS]) for start in range(0, len(drawn), PARAGRAPH_WORDS)
    )


def fill(passages: int, rng: random.Random) -> tuple[object, object, float]:
    from django.contrib.auth.models import User

    from accounts.services import account_for
    from documents import services
    from documents.models import Passage
    from generation.models import Conversation

    user = User.objects.create_user(f"bench-{rng.randrange(10**9)}")
    plan = account_for(user).plan
    plan.max_documents_per_conversation = 10_000
    plan.save()
    conversation = Conversation.objects.create(user=user, model="bench")
    words = vocabulary(rng)
    weights = list(itertools.accumulate(1 / rank for rank in range(1, len(words) + 1)))
    started = time.perf_counter()
    for number in itertools.count():
        if Passage.objects.filter(document__conversation=conversation).count() >= passages:
            break
        text = document_text(rng, words, weights)
        services.document_add(
            user=user, conversation_id=conversation.id, name=f"doc-{number}.txt", kind="text", size=len(text), text=text
        )
    return user, conversation, time.perf_counter() - started


def vectors_fill(conversation: object, rng: random.Random, *, embed_all: bool) -> float:
    """Give the conversation's passages vectors (see the module's docstring); seconds taken."""
    import numpy as np

    from documents.models import Passage, PassageVector
    from documents.vectors import passage_embedder, passages_embed
    from inference.embedding import vector_bytes

    embedder = passage_embedder()
    assert embedder is not None, "the embedding model's package is not installed"
    started = time.perf_counter()
    passages = list(
        Passage.objects.filter(document__conversation=conversation).values_list("pk", "document_id", "text")
    )
    if embed_all:
        passages_embed([pk for pk, _, _ in passages], embedder)
        return time.perf_counter() - started
    pool = embedder.embed([text for _, _, text in rng.sample(passages, 256)], truncate=True).vectors
    noise = np.random.default_rng(19).normal(0, 0.02, size=(len(passages), embedder.dimensions)).astype(np.float32)
    vectors = pool[np.arange(len(passages)) % len(pool)] + noise
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    PassageVector.objects.bulk_create(
        (
            PassageVector(passage_id=pk, document_id=document_id, model=embedder.name, vector=vector_bytes(vector))
            for (pk, document_id, _), vector in zip(passages, vectors, strict=True)
        ),
        batch_size=1000,
    )
    return time.perf_counter() - started


def quality() -> dict[str, int]:
    """Questions of the test corpus whose document is among the top 3 sources, of 20 each."""
    from django.contrib.auth.models import User

    from accounts.services import account_for
    from documents import services
    from documents.models import Passage
    from documents.search import passages_search, query_terms
    from documents.vectors import passage_embedder
    from generation.models import Conversation
    from tests.documents.corpus import DOCUMENTS, PARAPHRASES, QUESTIONS

    user = User.objects.create_user("bench-quality")
    plan = account_for(user).plan
    plan.max_documents_per_conversation = len(DOCUMENTS)
    plan.save()
    conversation = Conversation.objects.create(user=user, model="bench")
    embedder = passage_embedder()
    assert embedder is not None, "the embedding model's package is not installed"
    embedder.load()  # as a warm site's: the documents embedded as they are added, questions too
    documents = [
        services.document_add(
            user=user, conversation_id=conversation.id, name=name, kind="text", size=len(text), text=text
        )
        for name, text in DOCUMENTS.items()
    ]
    ids = [document.pk for document in documents]
    limit = services.RETRIEVED_PASSAGES

    def found(question: str, expected: str, hybrid: bool) -> bool:
        top = (
            services.passages_find(ids, question, limit)
            if hybrid
            else passages_search(ids, query_terms(question), limit)
        )
        names = Passage.objects.select_related("document").in_bulk(top)
        return expected in [names[pk].document.name for pk in top][:3]

    return {
        f"{label}_{'hybrid' if hybrid else 'words'}": sum(found(q, expected, hybrid) for q, expected in questions)
        for label, questions in (("questions", QUESTIONS), ("paraphrases", PARAPHRASES))
        for hybrid in (False, True)
    }


def measure(user: object, conversation: object, queries: int, rng: random.Random) -> dict[str, float]:
    from documents import services
    from documents.models import Passage

    texts = list(Passage.objects.filter(document__conversation=conversation).values_list("text", flat=True))
    questions = [
        " ".join(rng.sample(rng.choice(texts).split(), 4) + rng.sample(QUESTION_PADDING, 3)) + "?"
        for _ in range(queries + 20)
    ]
    times_ms = []
    found = 0
    for n, question in enumerate(questions):
        started = time.perf_counter()
        retrieval = services.retrieval_for(user=user, conversation_id=conversation.id, question=question)  # type: ignore[attr-defined]
        elapsed = (time.perf_counter() - started) * 1000
        if n >= 20:  # the first ones warm the caches
            times_ms.append(elapsed)
            found += bool(retrieval and retrieval.sources)
    times_ms.sort()
    return {
        "queries": queries,
        "with_sources": found,
        "median_ms": round(statistics.median(times_ms), 2),
        "p95_ms": round(times_ms[int(len(times_ms) * 0.95) - 1], 2),
        "max_ms": round(times_ms[-1], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--embed-all", action="store_true", help="embed every passage with the model (slow)")
    args = parser.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="chatsite-bench-retrieval-")
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        os.environ["DATABASE_URL"] = f"sqlite:///{tmp.name}/bench.sqlite3"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    postgres = connection.vendor == "postgresql"
    if postgres:
        connection.creation.create_test_db(verbosity=0, autoclobber=True)
    else:
        call_command("migrate", verbosity=0)
    try:
        found = quality()
        rng = random.Random(19)
        from documents import services

        # The passages' vectors are written below, not in the background as a real upload's are.
        embedder, services.passage_embedder = services.passage_embedder, lambda: None  # type: ignore[assignment]
        try:
            user, conversation, fill_s = fill(args.passages, rng)
        finally:
            services.passage_embedder = embedder  # type: ignore[assignment]
        vectors_s = vectors_fill(conversation, rng, embed_all=args.embed_all)
        if postgres:
            # As autovacuum does soon after a bulk insert: the planner's statistics of the
            # new rows (without them it takes every tsquery to match one row).
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE documents_passage")
        from documents.models import Passage

        count = Passage.objects.filter(document__conversation=conversation).count()
        result = {
            "database": connection.vendor,
            "passages": count,
            "fill_s": round(fill_s, 1),
            "vectors": "all embedded" if args.embed_all else "256 embedded, the rest near them",
            "vectors_s": round(vectors_s, 1),
            **measure(user, conversation, args.queries, rng),
            "target_p95_ms": 50,
            "top3_of_20": found,
            "target_paraphrases_hybrid": 16,
            "date": time.strftime("%Y-%m-%d"),
        }
    finally:
        if postgres:
            connection.creation.destroy_test_db(connection.settings_dict["NAME"], verbosity=0)
        tmp.cleanup()
    print(json.dumps(result, indent=2))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"retrieval-{result['database']}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
