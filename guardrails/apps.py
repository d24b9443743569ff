from django.apps import AppConfig


class GuardrailsConfig(AppConfig):
    name = "guardrails"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "content policy"
