"""What idle unload (CHAT_MODEL_IDLE_UNLOAD_S) gives back: this process's resident memory
before the model loads, with it loaded and answering, once freed while idle, and the
time the next request takes to load it again and answer.

    python -m bench.idle_unload [--model smollm2-135m-instruct] [--dtype float32]

Runs the engine the server runs (inference.engine.Engine, batched), with a 1 s idle time.
"""

from __future__ import annotations

import argparse
import time
from functools import partial
from pathlib import Path

from inference.engine import Engine, Job
from inference.generators import GenerationParams, load_generator
from inference.registry import resolve_model
from inference.streams import InMemoryStreamStore, StreamEvent

PROMPT = [{"role": "user", "content": "Name three colours."}]


def resident_mib() -> int:
    status = Path("/proc/self/status").read_text()
    return next(int(line.split()[1]) // 1024 for line in status.splitlines() if line.startswith("VmRSS:"))


def answer(engine: Engine, stream_id: str) -> list[StreamEvent]:
    engine.submit(Job(stream_id, PROMPT, GenerationParams(max_tokens=16, temperature=0)))
    while not (events := engine.store.events(stream_id)) or not events[-1].terminal:
        time.sleep(0.02)
    return events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="float32", help="CHAT_DTYPE: auto, float32, bfloat16")
    parser.add_argument("--cache-dir", default=".cache/models")
    args = parser.parse_args()

    import torch  # noqa: F401  (imported before the baseline: the server imports it at start too)

    baseline = resident_mib()
    load = partial(
        load_generator,
        resolve_model(args.model),
        cache_dir=Path(args.cache_dir),
        device="cpu",
        dtype=args.dtype,
        synthetic_tokens_per_s=50,
    )
    engine = Engine(load, InMemoryStreamStore(), max_concurrent=4, idle_unload_s=1)
    engine.start()
    assert engine.wait_ready(300), engine.load_error
    answer(engine, "first")
    loaded = resident_mib()
    while engine.loaded:
        time.sleep(0.05)
    time.sleep(1)  # its memory is handed back just after it counts as unloaded
    unloaded = resident_mib()
    started = time.monotonic()
    events = answer(engine, "again")
    again_s = time.monotonic() - started
    engine.stop(10)
    print(f"{args.model} ({args.dtype}), resident memory of this process:")
    print(f"  before loading   {baseline:6d} MiB")
    print(f"  loaded, answered {loaded:6d} MiB")
    print(f"  freed while idle {unloaded:6d} MiB  ({loaded - unloaded} MiB given back)")
    print(f"next request: loaded again and answered in {again_s:.2f} s; its first event: {events[0].data}")


if __name__ == "__main__":
    main()
