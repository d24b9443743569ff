from django.apps import AppConfig


class ToolsConfig(AppConfig):
    name = "tools"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The checks module registers CHAT_TOOL_SERVERS's system check.
        from tools import checks  # noqa: F401
