from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from generation import views as generation_views

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="generation:chat"), name="home"),
    path("accounts/", include("accounts.urls")),
    path("chat/", include("generation.urls")),
    path("v1/", include("api.urls")),
    path("healthz", generation_views.healthz, name="healthz"),
    path("readyz", generation_views.readyz, name="readyz"),
    path("metrics", generation_views.metrics, name="metrics"),
    path("admin/", admin.site.urls),
]
