from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # A guest who logs in keeps the chat: received at Django's user_logged_in (accounts.guests).
        from accounts import guests  # noqa: F401
