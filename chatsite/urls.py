from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from django.views import defaults
from django.views.generic import RedirectView

from api import views as api_views
from api.errors import api_or_page
from chatsite import probes
from generation import share_views

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="generation:chat"), name="home"),
    path("accounts/oidc/", include("sso.urls")),
    path("accounts/two-factor/", include("twofactor.urls")),
    path("accounts/", include("accounts.urls")),
    path("chat/", include("generation.urls")),
    path("documents/", include("documents.urls")),
    # Share links: short, and outside /chat/ since they are not the owner's pages.
    path("s/<str:token>/", share_views.shared_conversation, name="shared"),
    path("s/<str:token>/continue/", share_views.shared_conversation_continue, name="shared_continue"),
    path("v1/", include("api.urls")),
    # vLLM's, at the root as there.
    path("tokenize", api_views.tokenize, name="tokenize"),
    path("detokenize", api_views.detokenize, name="detokenize"),
    path("healthz", probes.healthz, name="healthz"),
    path("readyz", probes.readyz, name="readyz"),
    path("metrics", probes.metrics, name="metrics"),
    path("admin/", admin.site.urls),
]

# What Django refuses itself: under /v1/ (and at /tokenize) the API's error object, elsewhere its pages.
handler400 = api_or_page(400, defaults.bad_request)
handler403 = api_or_page(403, defaults.permission_denied)
handler404 = api_or_page(404, defaults.page_not_found)
handler500 = api_or_page(500, defaults.server_error)
