"""Streaming overhead: the real model over HTTP/SSE against a raw model.generate().

    python -m bench.streaming [--runs 5] [--max-tokens 128]

Same prompt, model (SmolLM2-135M-Instruct, fp32, CPU), greedy settings and
machine, in one run, interleaving raw and HTTP runs so drift hits both alike.
Measures: delivered tokens/s over HTTP ÷ raw tokens/s; TTFT over HTTP minus raw
TTFT (median); and warm start, daphne process start → /readyz 200.
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

from tests.support.livesite import ROOT, ChatClient, LiveSite

PROMPT = "Write a detailed essay about the history of bicycles."
MODEL = "smollm2-135m-instruct"
# bench/results/streaming.json, or under $BENCH_RESULTS_DIR when set (bench.revisions sets it).
RESULTS = Path(os.environ.get("BENCH_RESULTS_DIR") or Path(__file__).parent / "results") / "streaming.json"


class TimingStreamer:
    """A bare transformers streamer that only timestamps each new token."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value) -> None:
        if self._prompt_seen:
            self.times.extend([time.perf_counter()] * value.numel())
        self._prompt_seen = True

    def end(self) -> None:
        pass


def raw_run(generator, max_tokens: int) -> dict:
    import torch

    messages = [{"role": "user", "content": PROMPT}]
    started = time.perf_counter()
    inputs = generator.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    streamer = TimingStreamer()
    with torch.inference_mode():
        output = generator.model.generate(**inputs, max_new_tokens=max_tokens, do_sample=False, streamer=streamer)
    new = output[0, inputs["input_ids"].shape[1] :]
    tokens = len(streamer.times)
    return {
        "ttft_s": streamer.times[0] - started,
        "tokens": tokens,
        "tokens_per_s": tokens / (streamer.times[-1] - started),
        "text": generator.tokenizer.decode(new, skip_special_tokens=True),
    }


def http_run(client: ChatClient, user, max_tokens: int) -> dict:
    from generation.models import Conversation, Message

    conversation = Conversation.objects.create(user=user, model=MODEL, temperature=0, max_tokens=max_tokens)
    sent = client.send(PROMPT, conversation.get_absolute_url())
    events = list(client.stream(sent.stream_url))
    tokens = [e for e in events if e.event == "token"]
    answer = Message.objects.get(stream_id=sent.stream_url.rstrip("/").rsplit("/", 1)[-1])
    return {
        "ttft_s": tokens[0].at - sent.sent_at,
        "tokens": answer.completion_tokens,
        "tokens_per_s": answer.completion_tokens / (tokens[-1].at - sent.sent_at),
        "text": "".join(ChatClient.delta(e) for e in tokens),
        "events": len(tokens),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()

    subprocess.run([sys.executable, "manage.py", "prepare_model"], cwd=ROOT, check=True)
    with LiveSite(env={"CHAT_MODEL": MODEL}) as site:
        starts = [site.ready_after_s]
        for _ in range(2):
            site.stop()
            site.start()
            starts.append(site.ready_after_s)

        os.environ["DATABASE_URL"] = site.env["DATABASE_URL"]
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
        import django

        django.setup()
        from django.conf import settings
        from django.contrib.auth import get_user_model

        from inference.generators import load_generator
        from inference.registry import resolve_model

        generator = load_generator(
            resolve_model(MODEL), cache_dir=settings.MODEL_CACHE_DIR, device="cpu", synthetic_tokens_per_s=50
        )
        client = ChatClient(site.base_url)
        client.signup("bench")
        user = get_user_model().objects.get(username="bench")
        raw_run(generator, 8)  # warm both sides once
        http_run(client, user, 8)
        raws, https = [], []
        for _ in range(args.runs):
            raws.append(raw_run(generator, args.max_tokens))
            https.append(http_run(client, user, args.max_tokens))

    median = statistics.median
    result = {
        "command": f"python -m bench.streaming --runs {args.runs} --max-tokens {args.max_tokens}",
        "date": time.strftime("%Y-%m-%d"),
        "cpu_count": os.cpu_count(),
        "same_text": all(r["text"] == h["text"] for r, h in zip(raws, https, strict=False)),
        "tokens": median(h["tokens"] for h in https),
        "raw_tokens_per_s": median(r["tokens_per_s"] for r in raws),
        "http_tokens_per_s": median(h["tokens_per_s"] for h in https),
        "raw_ttft_ms": median(r["ttft_s"] for r in raws) * 1000,
        "http_ttft_ms": median(h["ttft_s"] for h in https) * 1000,
        "warm_start_s": median(starts),
        "warm_starts_s": starts,
    }
    result["throughput_ratio"] = result["http_tokens_per_s"] / result["raw_tokens_per_s"]
    result["ttft_overhead_ms"] = result["http_ttft_ms"] - result["raw_ttft_ms"]
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({**result, "raw": raws, "http": https}, indent=2) + "\n")

    print(f"{'figure':<40}{'measured':>12}{'target':>12}")
    print(f"{'tokens/s raw model.generate':<40}{result['raw_tokens_per_s']:>12.1f}")
    print(f"{'tokens/s delivered over HTTP/SSE':<40}{result['http_tokens_per_s']:>12.1f}")
    print(f"{'ratio HTTP / raw':<40}{result['throughput_ratio']:>12.3f}{'>= 0.95':>12}")
    print(f"{'TTFT raw (ms, median)':<40}{result['raw_ttft_ms']:>12.1f}")
    print(f"{'TTFT over HTTP (ms, median)':<40}{result['http_ttft_ms']:>12.1f}")
    print(f"{'TTFT overhead (ms)':<40}{result['ttft_overhead_ms']:>12.1f}{'<= 50':>12}")
    print(f"{'warm start → /readyz 200 (s, median of 3)':<40}{result['warm_start_s']:>12.2f}{'<= 10':>12}")
    print(f"{'same text raw and HTTP (greedy)':<40}{result['same_text']!s:>12}")
    print(f"results written to {RESULTS}")


if __name__ == "__main__":
    main()
