"""The developer API's costs, measured in one run.

    python -m bench.api [--runs 5] [--max-tokens 128] [--checks 300]

1. Checks: what authenticating the API key, admitting the request against the plan
   (rate limit, concurrent streams, daily tokens) and writing/closing its usage record
   cost per request — each step timed alone, in this process, on a fresh SQLite database
   (or DATABASE_URL's), `--checks` times; the target is ≤ 5 ms median for all of them.
2. Throughput: tokens/s delivered to the official `openai` client (streaming, greedy,
   SmolLM2-135M-Instruct on daphne) ÷ a raw `model.generate()` of the same prompt in this
   process, alternating runs; target ≥ 0.95.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from bench.streaming import MODEL, PROMPT, raw_run
from tests.support.livesite import ROOT, ChatClient, LiveSite

RESULTS = Path(__file__).parent / "results" / "api.json"


def time_checks(count: int) -> dict[str, float]:
    """Median milliseconds of each per-request check, on the configured database."""
    from django.contrib.auth.models import User

    from accounts.models import Account
    from accounts.services import (
        account_for,
        api_key_authenticate,
        api_key_create,
        usage_admit,
        usage_finish,
        usage_request_count,
    )

    user = User.objects.create_user(f"bench-{uuid.uuid4().hex[:8]}")
    Account.objects.filter(pk=account_for(user).pk).update(requests_per_minute=10**6, max_concurrent_streams=10**6)
    _, plain = api_key_create(user=user, name="bench")
    timings: dict[str, list[float]] = {"authenticate": [], "admit": [], "finish": [], "total": []}
    for _ in range(count):
        started = time.perf_counter()
        key = api_key_authenticate(plain)
        authenticated = time.perf_counter()
        stream_id = uuid.uuid4().hex
        limits = account_for(user).limits
        usage_admit(
            user=user,
            limits=limits,
            requests=usage_request_count(user=user, limits=limits, requested_max_tokens=16),
            channel="api",
            model=MODEL,
            stream_id=stream_id,
            producer="bench",
            prompt_tokens=8,
            max_tokens=16,
            api_key=key,
        )
        admitted = time.perf_counter()
        usage_finish(
            stream_id=stream_id,
            status="complete",
            finish_reason="length",
            prompt_tokens=8,
            completion_tokens=16,
            ttft_ms=10,
            duration_ms=100,
        )
        finished = time.perf_counter()
        timings["authenticate"].append(authenticated - started)
        timings["admit"].append(admitted - authenticated)
        timings["finish"].append(finished - admitted)
        timings["total"].append(finished - started)
    return {name: statistics.median(values) * 1000 for name, values in timings.items()}


def openai_run(client, max_tokens: int) -> dict:
    started = time.perf_counter()
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, times, usage = [], [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
            times.append(time.perf_counter())
        if chunk.usage:
            usage = chunk.usage
    assert usage is not None
    return {
        "ttft_s": times[0] - started,
        "tokens": usage.completion_tokens,
        "tokens_per_s": usage.completion_tokens / (times[-1] - started),
        "text": "".join(pieces),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--checks", type=int, default=300)
    args = parser.parse_args()

    import openai

    subprocess.run([sys.executable, "manage.py", "prepare_model"], cwd=ROOT, check=True)
    with LiveSite(env={"CHAT_MODEL": MODEL}) as site:
        ChatClient(site.base_url).signup("bench")
        key = subprocess.run(
            [sys.executable, "manage.py", "create_api_key", "bench"],
            cwd=ROOT,
            env=site.env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if "DATABASE_URL" not in os.environ:
            os.environ["DATABASE_URL"] = site.env["DATABASE_URL"]
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
        import django

        django.setup()
        from django.conf import settings

        from inference.generators import load_generator
        from inference.registry import resolve_model

        checks = time_checks(args.checks)
        database = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
        generator = load_generator(
            resolve_model(MODEL), cache_dir=settings.MODEL_CACHE_DIR, device="cpu", synthetic_tokens_per_s=50
        )
        client = openai.OpenAI(base_url=f"{site.base_url}/v1", api_key=key, max_retries=0)
        raw_run(generator, 8)
        openai_run(client, 8)
        raws, apis = [], []
        for _ in range(args.runs):
            raws.append(raw_run(generator, args.max_tokens))
            apis.append(openai_run(client, args.max_tokens))

    median = statistics.median
    result = {
        "command": f"python -m bench.api --runs {args.runs} --max-tokens {args.max_tokens} --checks {args.checks}",
        "date": time.strftime("%Y-%m-%d"),
        "cpu_count": os.cpu_count(),
        "database": database,
        "checks_median_ms": checks,
        "raw_tokens_per_s": median(r["tokens_per_s"] for r in raws),
        "openai_tokens_per_s": median(a["tokens_per_s"] for a in apis),
        "raw_ttft_ms": median(r["ttft_s"] for r in raws) * 1000,
        "openai_ttft_ms": median(a["ttft_s"] for a in apis) * 1000,
        "same_text": all(r["text"] == a["text"] for r, a in zip(raws, apis, strict=True)),
        "tokens": median(a["tokens"] for a in apis),
    }
    result["throughput_ratio"] = result["openai_tokens_per_s"] / result["raw_tokens_per_s"]
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({**result, "raw": raws, "openai": apis}, indent=2) + "\n")

    print(f"{'figure':<46}{'measured':>10}{'target':>10}")
    for name, value in checks.items():
        print(f"{'check ' + name + ' (ms, median, ' + database + ')':<46}{value:>10.2f}")
    print(f"{'  all checks per request (ms)':<46}{checks['total']:>10.2f}{'<= 5':>10}")
    print(f"{'tokens/s raw model.generate':<46}{result['raw_tokens_per_s']:>10.1f}")
    print(f"{'tokens/s through the openai client':<46}{result['openai_tokens_per_s']:>10.1f}")
    print(f"{'ratio openai / raw':<46}{result['throughput_ratio']:>10.3f}{'>= 0.95':>10}")
    print(f"{'TTFT raw / openai (ms, median)':<46}{result['raw_ttft_ms']:>5.0f} /{result['openai_ttft_ms']:>4.0f}")
    print(f"{'same text raw and openai (greedy)':<46}{result['same_text']!s:>10}")
    print(f"results written to {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
