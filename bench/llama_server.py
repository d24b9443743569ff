"""llama.cpp's own `llama-server` on the packaged SmolLM2 GGUF: what the embedded engine
is measured against (#37), built once per machine and benched like chatsite.

    .venv/bin/python -m bench.llama_server [--levels 1,8] [--parallel 8] [--threads 2]
        [--label llama-server]

Builds `llama-server` from the llama.cpp source that llama-cpp-python's sdist vendors
(the version installed here, downloaded from PyPI once) into `.cache/llama-server/`,
unless it is there already: CMake, the `llama-server` target only, about 8 minutes on two
cores. Then serves the same GGUF file chatsite's model comes from (the one the tests give
llama-cpp-python's server) with continuous batching and `--parallel` slots, and runs
bench.concurrency's closed loop against it (`--url`): the same prompts, greedy,
`--max-tokens`, the official `openai` client. Results: bench/results/concurrency-<label>.json,
the server's log beside them (`….server.log`).

Run it beside `python -m bench.concurrency --levels 1,8 …` for chatsite's configurations,
one after the other on a quiet machine, and compare ratios of the same run
(docs/benchmarks.md, "The embedded engine on a CPU").
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from bench.concurrency import write_server_log
from tests.support.livesite import ROOT, free_port, stop_process

BUILD_DIR = ROOT / ".cache" / "llama-server"
SERVER = BUILD_DIR / "bin" / "llama-server"
MODEL_ALIAS = "smollm2-gguf"


def build() -> Path:
    """The llama-server binary, built here first if it is not."""
    if SERVER.exists():
        return SERVER
    version = importlib.metadata.version("llama-cpp-python")
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    sdist = BUILD_DIR / f"llama_cpp_python-{version}.tar.gz"
    if not sdist.exists():
        download = ["pip", "download", f"llama-cpp-python=={version}", "--no-deps", "--no-binary", ":all:"]
        subprocess.run(
            [sys.executable, "-m", *download, "-d", str(BUILD_DIR)],
            check=True,
        )
    source = BUILD_DIR / "source"
    if not source.exists():
        prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
        with tarfile.open(sdist) as archive:
            members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
            for member in members:
                member.name = member.name[len(prefix) :]
            archive.extractall(source, members=[m for m in members if m.name], filter="data")
    flags = ["-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_CURL=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON"]
    configure = ["cmake", "-S", str(source), "-B", str(BUILD_DIR / "build"), "-DCMAKE_BUILD_TYPE=Release", *flags]
    subprocess.run(configure, check=True)
    jobs = str(os.cpu_count() or 2)
    subprocess.run(["cmake", "--build", str(BUILD_DIR / "build"), "--target", "llama-server", "-j", jobs], check=True)
    SERVER.parent.mkdir(exist_ok=True)
    (BUILD_DIR / "build" / "bin" / "llama-server").rename(SERVER)
    return SERVER


class LlamaServer:
    """`with LlamaServer(parallel=8, threads=2) as server:` builds llama-server if need be,
    serves the packaged GGUF with continuous batching and waits until it answers; its
    OpenAI API at `server.base_url`, the model named `server.model`. Sets Django up in this
    process (the GGUF comes from chatsite's model registry). `cpus` (`taskset -c` form) pins it.

    The same attributes as tests.support.upstreams.TransformersServe, so that bench.upstream
    can put chatsite in front of either."""

    model = MODEL_ALIAS

    def __init__(self, *, parallel: int = 8, threads: int = os.cpu_count() or 2, cpus: str | None = None) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="llama-server-")
        self.parallel, self.threads, self.cpus = parallel, threads, cpus
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log_path = Path(self._tmp.name) / "server.log"
        self.command: list[str] = []
        self.process: subprocess.Popen[bytes] | None = None
        self.ready_after_s: float | None = None
        self.warm_up_s: float | None = None  # bench.concurrency's warm-up serves it

    def __enter__(self) -> LlamaServer:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
        import django

        django.setup()
        from inference.loading import assemble_gguf
        from inference.registry import resolve_model
        from tests.support.upstreams import APP_MODEL, wait_until_answering

        server = build()
        gguf = assemble_gguf(resolve_model(APP_MODEL), Path(self._tmp.name))
        command = ["taskset", "-c", self.cpus] if self.cpus else []
        command += [str(server), "--model", str(gguf), "--alias", self.model, "--host", "127.0.0.1"]
        command += ["--port", str(self.port), "--parallel", str(self.parallel), "--cont-batching"]
        command += ["--threads", str(self.threads), "--ctx-size", str(2048 * self.parallel)]
        self.command = command
        started = time.monotonic()
        self.process = subprocess.Popen(command, stdout=self.log_path.open("ab"), stderr=subprocess.STDOUT)
        try:
            deadline = started + 120
            wait_until_answering(self.process, f"{self.base_url}/models", deadline, name="llama-server", log=self.log)
        except BaseException:
            self.__exit__()
            raise
        self.ready_after_s = time.monotonic() - started
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process:
            stop_process(self.process)
        self._tmp.cleanup()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,8")
    parser.add_argument("--parallel", type=int, default=8, help="llama-server's slots (--parallel)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--label", default="llama-server")
    args = parser.parse_args()

    server = LlamaServer(parallel=args.parallel, threads=args.threads)
    with server:
        try:
            target = ["--url", server.base_url.removesuffix("/v1"), "--api-key", "none", "--model", server.model]
            load = ["--levels", args.levels, "--max-tokens", str(args.max_tokens), "--label", args.label]
            subprocess.run([sys.executable, "-m", "bench.concurrency", *target, *load], cwd=ROOT, check=True)
        finally:
            print(f"server log written to {write_server_log(args.label, server.log())}")


if __name__ == "__main__":
    main()
