"""Time to first token turn by turn in one conversation: the prefix cache off, on, and llama-server.

    python -m bench.conversation [--turns 8] [--conversations 3] [--max-tokens 96]
        [--prefix-cache-mb 0,256] [--llama-server] [--label conversation]
    python -m bench.conversation --plot bench/results/conversation.json --output docs/conversation.png

A chat's every turn sends the whole conversation so far: the model's own earlier answers
and a new question (a fixed list of follow-ups), greedy, through the official `openai`
client, one request at a time. chatsite starts once per `GENERATION_PREFIX_CACHE_MB` value
(daphne, its own SQLite database, SmolLM2-135M-Instruct); with `--llama-server`,
llama.cpp's own server (bench.llama_server) runs the same conversations last, with its
prompt cache (on by default). Each conversation opens with a different question, so no
turn's prompt was seen before. Per system and turn: the prompt's tokens (from usage) and
the median time to first token over the conversations. Writes
bench/results/<label>.json and every request's record to bench/results/raw/<label>.json;
`--plot` draws a results file's time to first token against the prompt's tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from bench import result_files
from bench.concurrency import (
    MODEL,
    PROMPTS,
    Target,
    bench_api_key,
    prepare_model,
    resolved_dtype,
    results_dir,
)
from tests.support.livesite import LiveSite

FOLLOW_UPS = (
    "Can you say more about that?",
    "Give me an example.",
    "What is the most common mistake people make here?",
    "Summarise what you said in two sentences.",
    "How would you explain it to a ten-year-old?",
    "What is one thing most people don't know about it?",
    "Which part of your answer is the least certain?",
    "Thanks. One last tip?",
)


def converse(target: Target, opening: str, turns: int, max_tokens: int) -> list[dict[str, Any]]:
    """One conversation of `turns` questions, each sent with the answers so far: a record per turn."""
    import openai

    api = openai.OpenAI(base_url=f"{target.base_url}/v1", api_key=target.api_key, max_retries=0, timeout=600)
    messages: list[dict[str, str]] = []
    records = []
    for turn, question in enumerate([opening, *FOLLOW_UPS][:turns]):
        messages.append({"role": "user", "content": question})
        started = time.perf_counter()
        first: float | None = None
        pieces: list[str] = []
        usage = None
        stream = api.chat.completions.create(
            model=target.model,
            messages=messages,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            content = chunk.choices[0].delta.content if chunk.choices else None
            if content:
                first = first or time.perf_counter()
                pieces.append(content)
            usage = chunk.usage or usage
        answer = "".join(pieces)
        messages.append({"role": "assistant", "content": answer})
        records.append(
            {
                "turn": turn + 1,
                "prompt_tokens": usage.prompt_tokens if usage else None,
                "completion_tokens": usage.completion_tokens if usage else None,
                "ttft_s": None if first is None else first - started,
                "total_s": time.perf_counter() - started,
            }
        )
    api.close()
    return records


def run_system(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    """Warm-up (one short conversation on a question of its own), then the conversations:
    per turn, the median prompt tokens and time to first token, and every record."""
    converse(target, PROMPTS[-1], 2, 16)
    records = [
        {"conversation": number, **record}
        for number in range(args.conversations)
        for record in converse(target, PROMPTS[number], args.turns, args.max_tokens)
    ]
    turns = []
    for turn in range(1, args.turns + 1):
        of_turn = [record for record in records if record["turn"] == turn]
        ttfts = [record["ttft_s"] for record in of_turn if record["ttft_s"] is not None]
        turns.append(
            {
                "turn": turn,
                "prompt_tokens": statistics.median(record["prompt_tokens"] or 0 for record in of_turn),
                "ttft_p50_s": statistics.median(ttfts) if ttfts else None,
            }
        )
    return {"turns": turns, "records": records}


def print_system(name: str, turns: list[dict[str, Any]]) -> None:
    cells = "  ".join(f"{turn['prompt_tokens']:>5.0f}:{1000 * (turn['ttft_p50_s'] or 0):>6.0f}" for turn in turns)
    print(f"{name:<22} {cells}", flush=True)


def plot(payload: dict[str, Any], output: Path) -> None:
    """Each system's median time to first token against its turns' prompt tokens."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.2))
    for name, system in payload["systems"].items():
        turns = [turn for turn in system["turns"] if turn["ttft_p50_s"] is not None]
        x = [turn["prompt_tokens"] for turn in turns]
        axes.plot(x, [1000 * turn["ttft_p50_s"] for turn in turns], marker="o", label=name)
    axes.set_xlabel("prompt tokens (the conversation so far)")
    axes.set_ylabel("median time to first token (ms)")
    axes.set_ylim(bottom=0)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    settings = payload["settings"]
    axes.set_title(
        f"One conversation, turn by turn: {settings['conversations']} conversations of "
        f"{settings['turns']} turns, {settings['dtype']} ({payload['date'][:10]})",
        fontsize="medium",
    )
    figure.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=8, choices=range(1, len(FOLLOW_UPS) + 2), metavar="1-9")
    parser.add_argument("--conversations", type=int, default=3, choices=range(1, len(PROMPTS)), metavar="1-15")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--prefix-cache-mb", default="0,256", help="GENERATION_PREFIX_CACHE_MB values, one server each")
    parser.add_argument("--llama-server", action="store_true", help="also llama.cpp's server, last")
    parser.add_argument("--label", default="conversation")
    parser.add_argument("--plot", type=Path, help="plot this results file instead of measuring")
    parser.add_argument("--output", type=Path, default=Path("docs/conversation.png"), help="the plot's file")
    args = parser.parse_args()
    if args.plot:
        plot(json.loads(args.plot.read_text()), args.output)
        print(f"plot written to {args.output}")
        return

    budgets = [int(part) for part in args.prefix_cache_mb.split(",") if part.strip()]
    prepare_model({"CHAT_MODEL": MODEL})
    systems: dict[str, Any] = {}
    print(f"{'system':<22} per turn: prompt tokens:TTFT p50 ms", flush=True)
    for budget in budgets:
        name = f"chatsite, {budget} MiB"
        with LiveSite(env={"CHAT_MODEL": MODEL, "GENERATION_PREFIX_CACHE_MB": str(budget)}) as site:
            systems[name] = run_system(Target(site.base_url, bench_api_key(site), MODEL), args)
        print_system(name, systems[name]["turns"])
    if args.llama_server:
        from bench.llama_server import LlamaServer

        with LlamaServer() as server:
            target = Target(server.base_url.removesuffix("/v1"), "none", server.model)
            systems["llama-server"] = run_system(target, args)
        print_system("llama-server", systems["llama-server"]["turns"])

    settings = {key: getattr(args, key) for key in ("turns", "conversations", "max_tokens")}
    payload = {
        "label": args.label,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "settings": {**settings, "dtype": resolved_dtype(argparse.Namespace(device=None, dtype=None))},
        "systems": {name: {"turns": system["turns"]} for name, system in systems.items()},
    }
    raw = {"label": args.label, "systems": {name: system["records"] for name, system in systems.items()}}
    path = results_dir() / f"{args.label}.json"
    result_files.write(path, payload, raw)
    print(f"results written to {path}")


if __name__ == "__main__":
    main()
