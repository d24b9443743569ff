from django.urls import path

from twofactor import views

app_name = "twofactor"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("setup/", views.setup, name="setup"),
    path("code/", views.verify, name="verify"),
    path("recovery-codes/", views.recovery_codes, name="recovery_codes"),
    path("off/", views.disable, name="disable"),
]
