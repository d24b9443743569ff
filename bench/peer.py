"""The concurrency load of bench.concurrency, against `transformers serve --continuous-batching`.

    python -m bench.peer [--levels 1,4,8,32] [--requests N] [--max-tokens 128]
        [--dtype float32|bfloat16] [--device cpu|cuda] [--venv .cache/peer-venv | --python PATH]
        [--cb-num-blocks N] [--cb-max-batch-tokens 512]

The peer gets its own virtual environment (made once, then reused; a stamp file records
what was installed) with the same torch and transformers as the app, or runs under
--python, an interpreter that has them already (bench/gpu.sh, offline). It serves the
same converted weights (the safetensors directory `manage.py prepare_model` leaves under
MODEL_CACHE_DIR) on CPU in float32 (or --dtype bfloat16, --device cuda). Its paged KV
cache is sized for the load, not left to the default, which takes a share of the whole
machine's memory. Its log is kept beside the results. It is warmed up as
chatsite is (its first request, timed, is slow). Reports install and start times and the
server's resident memory as well as the same table as bench.concurrency, into
bench/results/concurrency-peer.json.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.concurrency import (
    MODEL,
    Target,
    add_load_arguments,
    load_settings,
    measure,
    process_memory_mb,
    write_results,
    write_server_log,
)
from tests.support.livesite import ROOT, free_port, stop_process
from tests.support.upstreams import paged_cache_blocks, prepared_model_dir

# The same versions as the app's requirements.txt; torch comes from the local CPU wheel.
PEER_REQUIREMENTS = ("torch==2.13.0", "transformers[serving]==5.24.0")
STAMP = ".bench-installed"


def ensure_peer_venv(venv: Path) -> float | None:
    """Make the peer's venv unless its stamp says it is done; seconds it took, or None."""
    stamp = venv / STAMP
    wanted = "\n".join(PEER_REQUIREMENTS) + "\n"
    if stamp.exists() and stamp.read_text() == wanted:
        return None
    started = time.monotonic()
    if not (venv / "bin" / "python").exists():
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", *PEER_REQUIREMENTS], check=True)
    stamp.write_text(wanted)
    return time.monotonic() - started


def serve_command(python: Path, model_dir: Path, port: int, args: argparse.Namespace) -> list[str]:
    return [
        str(python),
        "-m",
        "transformers.cli.transformers",  # the `transformers` command, from this interpreter
        "serve",
        str(model_dir),
        "--continuous-batching",
        "--device",
        args.device,
        "--dtype",
        args.dtype,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--cb-num-blocks",
        str(args.cb_num_blocks),
        "--cb-max-batch-tokens",
        str(args.cb_max_batch_tokens),
    ]


def start_peer(command: list[str], base_url: str, log_path: Path, timeout: float = 300) -> subprocess.Popen[bytes]:
    """Start the server and wait until /health answers (it loads the model before listening)."""
    process = subprocess.Popen(command, cwd=ROOT, stdout=log_path.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"transformers serve exited with {process.returncode}:\n{log_path.read_text()}")
        try:
            if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    process.kill()
    raise TimeoutError(f"transformers serve not healthy after {timeout} s:\n{log_path.read_text()}")


def _rss(memory: dict[str, float] | None) -> str:
    return f"{memory['rss']:.0f}" if memory else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_load_arguments(parser)
    parser.add_argument("--model", default=MODEL, help="the app's model whose converted weights the peer serves")
    parser.add_argument("--venv", type=Path, default=ROOT / ".cache" / "peer-venv")
    parser.add_argument(
        "--python", type=Path, help="an interpreter that has transformers[serving] already (no venv is made)"
    )
    parser.add_argument("--device", default="cpu", help="the peer's --device, e.g. cuda")
    parser.add_argument("--cb-num-blocks", type=int, help="KV-cache blocks (default: the highest level's need + 8)")
    parser.add_argument("--cb-max-batch-tokens", type=int, default=512, help="tokens per forward pass")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the weights' dtype")
    parser.add_argument("--label", help="results file suffix (default: peer, or peer-<dtype> if not float32)")
    args = parser.parse_args()
    args.label = args.label or ("peer" if args.dtype == "float32" else f"peer-{args.dtype}")
    max_level = max(args.levels)
    args.cb_num_blocks = args.cb_num_blocks or paged_cache_blocks(max_level, args.max_tokens)

    install_s = None if args.python else ensure_peer_venv(args.venv)
    python = args.python or args.venv / "bin" / "python"
    model_dir = prepared_model_dir(args.model)
    port = free_port()
    target = Target(f"http://127.0.0.1:{port}", "not-checked", str(model_dir))
    command = serve_command(python, model_dir, port, args)
    log_path = ROOT / ".cache" / "peer-serve.log"
    print(" ".join(command), flush=True)

    started = time.monotonic()
    process = start_peer(command, target.base_url, log_path)
    try:
        start_s = time.monotonic() - started
        rss_started = process_memory_mb(process.pid)
        print(f"peer: /health 200 after {start_s:.1f} s", flush=True)
        measured = measure(target, args, server_pid=process.pid)
        rss_end = process_memory_mb(process.pid)
    finally:
        stop_process(process)
        print(f"server log written to {write_server_log(args.label, log_path.read_text(errors='replace'))}")
    rss_warm = measured["warmup"]["server_rss_mb"]
    print(f"peer RSS MB: {_rss(rss_started)} started, {_rss(rss_warm)} warmed up, {_rss(rss_end)} at the end")

    payload = {
        "label": args.label,
        "server": "transformers serve --continuous-batching",
        "command": "python -m bench.peer " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "cpu_count": os.cpu_count(),
        "settings": {
            **load_settings(args),
            "model": args.model,
            "device": args.device,
            "dtype": args.dtype,
            "cb_num_blocks": args.cb_num_blocks,
            "cb_max_batch_tokens": args.cb_max_batch_tokens,
            "requirements": list(PEER_REQUIREMENTS),
        },
        "server_process": {
            "serve_command": command,
            "install_s": install_s,
            "ready_after_s": start_s,
            "rss_mb": {"started": rss_started, "warm": rss_warm, "end": rss_end},
        },
        **measured,
    }
    path = write_results(args.label, payload)
    print(f"results written to {path}")


if __name__ == "__main__":
    main()
