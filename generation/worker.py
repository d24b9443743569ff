"""The model side of GENERATION_BACKEND=celery: what a generation worker process does.

A worker (`celery -A chatsite worker -Q generation -P threads`) loads its models once
and runs every generation task through one engine per model: each task is a thread that
hands its job to the engine and waits for the end, so concurrent tasks share the
engine's batches. While alive the worker beats, and registers the rows it can run with
the cross-process admission (inference/admission.py).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import prometheus_client
from django.conf import settings

from generation.backends import runtime
from generation.backends.dispatch import QUEUE_PRODUCER
from generation.backends.jobs import job_for, retried_on_a_new_connection
from generation.backends.reaping import generation_abandon
from generation.backends.router import InProcessBackend
from generation.services import generation_cancel, generation_claims
from inference.backend import GenerationTask
from inference.engine import EngineOverloaded, GenerationResult
from inference.streams import PRODUCER_BEAT_S, PRODUCER_BEAT_TTL_S, GenerationStatus
from infrastructure.metrics import export_loads

logger = logging.getLogger(__name__)


_started = threading.Event()


def thread_count() -> int:
    """Task threads for one worker: a full batch, and a full queue behind it."""
    return runtime.max_concurrent(runtime.model_spec()) + settings.GENERATION_MAX_QUEUE


def start() -> None:
    """At worker start: load the default model, and beat from now on."""
    if _started.is_set():
        return
    _started.set()
    runtime.local_engine()
    if settings.WORKER_METRICS_PORT:
        export_loads(InProcessBackend().loads, list)  # this worker's engines
        prometheus_client.start_http_server(settings.WORKER_METRICS_PORT)
    threading.Thread(target=_beat, name="chatsite-worker-beat", daemon=True).start()


def shut_down() -> None:
    """Celery's warm shutdown (SIGTERM): as a web process's, the engines take no new
    generation, let those under way finish for up to GRACEFUL_TIMEOUT seconds, and end
    the rest as interrupted with their text; their tasks then return and Celery exits."""
    if _started.is_set():
        InProcessBackend().shut_down(settings.GRACEFUL_TIMEOUT)


def _beat() -> None:
    store = runtime.stream_store()
    admission = runtime.admission()
    announced: set[str] = set()
    while True:
        try:
            store.beat(QUEUE_PRODUCER, ttl_s=PRODUCER_BEAT_TTL_S)
            for model, engine in runtime.local_engines().items():
                if engine.ready:
                    admission.register(model, engine.producer, engine.max_concurrent, ttl_s=PRODUCER_BEAT_TTL_S)
                    if model not in announced:
                        announced.add(model)
                        logger.info(
                            "Worker %s serves %s: %d rows at once", engine.producer, model, engine.max_concurrent
                        )
        except Exception:
            logger.exception("Worker heartbeat failed")
        time.sleep(PRODUCER_BEAT_S)


# The worker's database work runs on one thread with one kept connection: a connection
# per task thread would be hundreds of them.
_ledger = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chatsite-ledger")

# Which worker runs a generation reaches the ledger this long after the claim, together
# with the other claims of that moment, in one transaction. Generations come in bursts:
# this writes a burst's claims once, after their prompts are prefilled instead of on
# the same cores meanwhile. Until then the reaper reads the claims from the streams.
CLAIMS_DELAY_S = 0.5
_unrecorded: dict[str, dict[str, int | None]] = {}  # producer -> stream id -> answer id
_unrecorded_lock = threading.Lock()


def _note_claim(task: GenerationTask, producer: str) -> None:
    """Have the claim written into the ledger with the others of the next CLAIMS_DELAY_S."""
    with _unrecorded_lock:
        first = not _unrecorded
        _unrecorded.setdefault(producer, {})[task.stream_id] = task.message_id
    if first:
        _ledger.submit(_record_claims, CLAIMS_DELAY_S)


def _record_claims(delay_s: float) -> None:
    time.sleep(delay_s)
    with _unrecorded_lock:
        unrecorded = dict(_unrecorded)
        _unrecorded.clear()
    for producer, claims in unrecorded.items():
        record = partial(generation_claims, claims=claims, producer=producer)
        try:
            streaming = retried_on_a_new_connection(record)
        except Exception:  # the reaper still finds the worker through the streams' claims
            logger.exception("Could not record that %s runs %d generations", producer, len(claims))
            continue
        # Settled meanwhile: stop generating for nobody (for those that finished, a no-op).
        for stream_id in claims.keys() - streaming:
            generation_cancel(stream_id=stream_id)


def generate(task: GenerationTask) -> str:
    """Run one admitted generation on this worker's engine; return once it has ended."""
    engine = runtime.local_engine(task.model)
    # Claimed once, in one round trip: a task delivered twice, or one whose stream was
    # settled while it waited, generates nothing.
    store = runtime.stream_store()
    if not store.claim(task.stream_id, engine.producer):
        if not store.exists(task.stream_id):  # expired while it waited: settle it, or it streams forever
            abandon = partial(generation_abandon, stream_id=task.stream_id, message_id=task.message_id)
            _ledger.submit(retried_on_a_new_connection, abandon).result()
        logger.info("Generation %s was settled, taken or lost before it started; skipped", task.stream_id)
        return "skipped"
    _note_claim(task, engine.producer)
    logger.info("Generating %s with %s", task.stream_id, task.model)
    ended = threading.Event()
    outcome: list[GenerationResult] = []

    def done(result: GenerationResult) -> None:
        runtime.admission().release(task.model, task.stream_id)
        outcome.append(result)
        ended.set()

    job = job_for(task, on_done=done)
    try:
        engine.submit(job)
    except EngineOverloaded as error:  # more than this worker's queue: admission allowed for more workers
        refused = GenerationResult(
            text="", status=GenerationStatus.ERROR, finish_reason="error", error=f"Overloaded: {error}"
        )
        assert job.on_finish is not None
        job.on_finish(refused)
        store.append(task.stream_id, "error", {"message": refused.error, **refused.summary()})
    ended.wait()
    return outcome[0].status
