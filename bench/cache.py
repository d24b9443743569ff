"""The response cache's time to first token over HTTP, against a generated answer's.

    python -m bench.cache [--runs 10] [--max-tokens 16]

Each run asks a question of its own twice, greedily, as a streamed chat completion over
HTTP to a real daphne serving SmolLM2-135M-Instruct: the first answer is generated
(`x-chatsite-cache: miss`), the second streamed from the response cache (`hit`). TTFT is
the time from sending the request to the first content chunk read, on the client; the
target for a hit is ≤ 20 ms median. The texts must match.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.streaming import MODEL, PROMPT
from tests.support.livesite import ROOT, ChatClient, LiveSite

RESULTS = Path(__file__).parent / "results" / "cache.json"
TARGET_HIT_TTFT_MS = 20.0


def streamed_run(client: httpx.Client, question: str, max_tokens: int) -> dict:
    """One streamed greedy completion: its TTFT, cache header and text."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    started = time.perf_counter()
    first_at = None
    pieces = []
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            content = chunk["choices"][0]["delta"].get("content") if chunk.get("choices") else None
            if content:
                first_at = first_at or time.perf_counter()
                pieces.append(content)
        cache = response.headers.get("x-chatsite-cache")
    assert first_at is not None, "no content came"
    return {"ttft_ms": (first_at - started) * 1000, "cache": cache, "text": "".join(pieces)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()

    subprocess.run([sys.executable, "manage.py", "prepare_model"], cwd=ROOT, check=True)
    with LiveSite(env={"CHAT_MODEL": MODEL, "CHAT_RESPONSE_CACHE": "user"}) as site:
        ChatClient(site.base_url).signup("bench")
        manage = [sys.executable, "manage.py"]
        key = subprocess.run(
            [*manage, "create_api_key", "bench"], cwd=ROOT, env=site.env, capture_output=True, text=True, check=True
        ).stdout.strip()
        # Two requests a run: lift the plans' per-minute limit on this scratch database.
        lift = "from accounts.models import Plan; Plan.objects.update(requests_per_minute=10**6)"
        subprocess.run([*manage, "shell", "-c", lift], cwd=ROOT, env=site.env, check=True, capture_output=True)
        headers = {"Authorization": f"Bearer {key}"}
        generated, cached = [], []
        with httpx.Client(base_url=site.base_url, headers=headers, timeout=120) as client:
            for run in range(-1, args.runs):  # run -1 warms up both paths, not counted
                question = f"{PROMPT} (Question {run + 2}.)"
                miss = streamed_run(client, question, args.max_tokens)
                hit = streamed_run(client, question, args.max_tokens)
                assert (miss["cache"], hit["cache"]) == ("miss", "hit"), (miss["cache"], hit["cache"])
                assert hit["text"] == miss["text"], "the cached answer differs from the generated one"
                if run >= 0:
                    generated.append(miss)
                    cached.append(hit)

    median = statistics.median
    result = {
        "command": f"python -m bench.cache --runs {args.runs} --max-tokens {args.max_tokens}",
        "date": time.strftime("%Y-%m-%d"),
        "cpu_count": os.cpu_count(),
        "model": MODEL,
        "generated_ttft_ms_median": median(r["ttft_ms"] for r in generated),
        "hit_ttft_ms_median": median(r["ttft_ms"] for r in cached),
        "hit_ttft_ms_max": max(r["ttft_ms"] for r in cached),
        "target_hit_ttft_ms": TARGET_HIT_TTFT_MS,
        "same_text": all(g["text"] == c["text"] for g, c in zip(generated, cached, strict=True)),
    }
    RESULTS.parent.mkdir(exist_ok=True)
    runs = [
        {"generated_ttft_ms": g["ttft_ms"], "hit_ttft_ms": c["ttft_ms"]} for g, c in zip(generated, cached, strict=True)
    ]
    RESULTS.write_text(json.dumps({**result, "runs": runs}, indent=2) + "\n")

    print(f"{'figure':<44}{'measured':>10}{'target':>10}")
    print(f"{'TTFT generated answer (ms, median)':<44}{result['generated_ttft_ms_median']:>10.1f}")
    print(f"{'TTFT cache hit (ms, median)':<44}{result['hit_ttft_ms_median']:>10.1f}{'<= 20':>10}")
    print(f"{'TTFT cache hit (ms, max)':<44}{result['hit_ttft_ms_max']:>10.1f}")
    print(f"{'same text generated and cached':<44}{result['same_text']!s:>10}")
    print(f"results written to {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
