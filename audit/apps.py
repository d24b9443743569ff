from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "audit"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "audit trail"

    def ready(self) -> None:
        # Django's and django-axes' log-in events are theirs, sent as signals: received here.
        from audit import receivers  # noqa: F401
