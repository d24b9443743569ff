from django.apps import AppConfig


class BackupsConfig(AppConfig):
    name = "backups"
    default_auto_field = "django.db.models.BigAutoField"
