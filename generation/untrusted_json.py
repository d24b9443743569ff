"""JSON from people: the one parser for text that anyone may have written.

The API's bodies go through pydantic's own parser (api.views), which bounds nesting itself.
"""

from __future__ import annotations

import json
from typing import Any


def parse(text: str) -> Any:
    """The value `text` holds; ValueError for anything that is not JSON.

    A value nested too deeply for Python's parser (100,000 `[` take only 100 KB) is not
    JSON either: the parser's RecursionError would otherwise escape every `except ValueError`
    around it and end as a 500, or as a closed socket.
    """
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
