from django.urls import path, re_path

from api import responses, views

app_name = "api"

urlpatterns = [
    path("models", views.models_list, name="models"),
    path("chat/completions", views.chat_completions, name="chat_completions"),
    path("completions", views.completions, name="completions"),
    path("embeddings", views.embeddings, name="embeddings"),
    path("streams/<str:completion_id>", views.stream_resume, name="stream"),
    path("streams/<str:completion_id>/cancel", views.stream_cancel, name="stream_cancel"),
    path("responses", responses.responses_create, name="responses"),
    path("responses/<str:response_id>", responses.response_detail, name="response"),
    path("responses/<str:response_id>/cancel", responses.response_cancel, name="response_cancel"),
    path("usage", views.usage, name="usage"),
    path("openapi.json", views.openapi_json, name="openapi"),
    path("docs", views.api_docs, name="docs"),
    # Last: any other path under /v1/ answers OpenAI's 404 error object, whatever its method.
    re_path(r"", views.unknown_url, name="unknown_url"),
]
