"""The chat page's weight and server time.

    python -m bench.page [--requests 30]

A live site (daphne, its own SQLite database) holds one user with 50 conversations,
one of which has 40 messages (20 prompts and 20 Markdown answers with code). Measured:
- weight: the page's own HTML + CSS + JS, each gzip-compressed (htmx and its SSE
  extension, which come from django-htmx, are counted apart); target ≤ 60 KB;
- server time of `GET /chat/<id>/` for that conversation (median and p95 of
  `--requests`, on loopback, after a warm-up); target ≤ 300 ms.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import statistics
import time
from pathlib import Path

import httpx

from tests.support.livesite import ROOT, ChatClient, LiveSite

RESULTS = Path(__file__).parent / "results" / "page.json"
ANSWER = """Here is how to read a file in Python:

```python
from pathlib import Path

text = Path("notes.txt").read_text()
print(text.upper())
```

- `Path.read_text` opens and closes the file for you.
- Use **`encoding="utf-8"`** when the file is not ASCII.
"""


def make_conversations(username: str) -> str:
    from django.contrib.auth.models import User

    from generation.models import Conversation, Message

    user = User.objects.get(username=username)
    conversations = [
        Conversation(user=user, model="smollm2-135m-instruct", title=f"Conversation {n}") for n in range(50)
    ]
    Conversation.objects.bulk_create(conversations)
    target = conversations[-1]
    messages = []
    for n in range(20):
        messages.append(Message(conversation=target, role="user", content=f"Question {n}: how do I read a file?"))
        messages.append(
            Message(
                conversation=target,
                role="assistant",
                content=ANSWER,
                status="complete",
                completion_tokens=60,
                ttft_ms=90,
                duration_ms=2500,
            )
        )
    Message.objects.bulk_create(messages)
    return target.get_absolute_url()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args()

    with LiveSite(env={"CHAT_ENABLE_SYNTHETIC": "1", "CHAT_MODEL": "synthetic"}) as site:
        client = ChatClient(site.base_url)
        client.signup("bench")
        os.environ["DATABASE_URL"] = site.env["DATABASE_URL"]
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
        import django

        django.setup()
        url = make_conversations("bench")
        html = client.http.get(url).text
        assert html.count("<article") == 40, "the conversation page should show all 40 messages"
        assets = re.findall(r'(?:src|href)="(/static/[^"]+\.(?:css|js))"', html)
        sizes = {"html": len(gzip.compress(html.encode()))}
        for asset in assets:
            body = httpx.get(f"{site.base_url}{asset}").content
            sizes[asset] = len(gzip.compress(body))
        own = {name: size for name, size in sizes.items() if "django_htmx" not in name}
        for _ in range(5):
            client.http.get(url)
        times = []
        for _ in range(args.requests):
            started = time.perf_counter()
            assert client.http.get(url).status_code == 200
            times.append(time.perf_counter() - started)

    result = {
        "command": f"python -m bench.page --requests {args.requests}",
        "date": time.strftime("%Y-%m-%d"),
        "gzip_bytes": sizes,
        "own_gzip_kb": sum(own.values()) / 1024,
        "htmx_gzip_kb": (sum(sizes.values()) - sum(own.values())) / 1024,
        "server_ms_median": statistics.median(times) * 1000,
        "server_ms_p95": sorted(times)[int(len(times) * 0.95) - 1] * 1000,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    for name, size in sizes.items():
        print(f"{name:<60}{size / 1024:>8.1f} KB gzip")
    print(f"{'own HTML + CSS + JS (excluding htmx)':<60}{result['own_gzip_kb']:>8.1f} KB   target <= 60")
    timing = f"{result['server_ms_median']:.1f} / {result['server_ms_p95']:.1f} ms"
    print(f"{'GET conversation page, median / p95':<60}{timing:>14}   target <= 300")
    print(f"results written to {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
