from django.apps import AppConfig


class ApiConfig(AppConfig):
    """The OpenAI-compatible API: views over the chat app's services; it keeps stored Responses."""

    name = "api"
