from django.urls import path

from generation import api

app_name = "api"

urlpatterns = [
    path("models", api.models_list, name="models"),
    path("chat/completions", api.chat_completions, name="chat_completions"),
    path("completions", api.completions, name="completions"),
    path("streams/<str:completion_id>", api.stream_resume, name="stream"),
    path("streams/<str:completion_id>/cancel", api.stream_cancel, name="stream_cancel"),
    path("usage", api.usage, name="usage"),
    path("openapi.json", api.openapi_json, name="openapi"),
    path("docs", api.api_docs, name="docs"),
]
