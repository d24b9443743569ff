from __future__ import annotations

from django.urls import path

from sso import views

app_name = "sso"

urlpatterns = [
    path("start/", views.StartView.as_view(), name="start"),
    path("callback/", views.CallbackView.as_view(), name="callback"),
]
