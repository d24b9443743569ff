"""The system check of CHAT_TOOL_SERVERS: tagged like generation/checks.py's, so that
`manage.py` commands, daphne and Celery workers (`settings_check_or_stop`) all stop at
start-up on a bad value, naming it."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, register

from tools.mcp_client import ConfiguredToolServer, tool_servers_from_json

TAG = "chatsite"  # generation.checks.TAG: the tag the processes' start-up check runs


def configured_tool_servers() -> list[ConfiguredToolServer]:
    """CHAT_TOOL_SERVERS's servers; ValueError naming what is wrong."""
    return tool_servers_from_json(settings.CHAT_TOOL_SERVERS)


@register(TAG)
def tool_servers_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    try:
        configured_tool_servers()
    except ValueError as error:
        return [Error(f"CHAT_TOOL_SERVERS: {error} (see README: Tools)", id="tools.E001")]
    return []
