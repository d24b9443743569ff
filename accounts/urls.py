from django.contrib.auth import views as auth_views
from django.urls import path

from accounts import views

app_name = "accounts"

urlpatterns = [
    path("signup/", views.signup, name="signup"),
    path("signup/pending/", views.signup_pending, name="signup_pending"),
    path("guest/", views.guest_start, name="guest_start"),
    path("guest/keep/", views.guest_keep, name="guest_keep"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("password/", views.PasswordChangeView.as_view(), name="password_change"),
    path(
        "password/done/",
        auth_views.PasswordChangeDoneView.as_view(template_name="accounts/password_change_done.html"),
        name="password_change_done",
    ),
    path("password/reset/", views.PasswordResetView.as_view(), name="password_reset"),
    path(
        "password/reset/sent/",
        auth_views.PasswordResetDoneView.as_view(template_name="accounts/password_reset_done.html"),
        name="password_reset_done",
    ),
    path(
        "password/reset/<uidb64>/<token>/",
        views.PasswordResetConfirmView.as_view(),
        name="password_reset_confirm",
    ),
    path(
        "password/reset/complete/",
        auth_views.PasswordResetCompleteView.as_view(template_name="accounts/password_reset_complete.html"),
        name="password_reset_complete",
    ),
    path("email/", views.email, name="email"),
    path("keys/", views.keys, name="keys"),
    path("keys/<int:key_id>/revoke/", views.key_revoke, name="key_revoke"),
    path("keys/<int:key_id>/", views.key_settings, name="key_settings"),
    # Its budget alone (the page before a key had settings of its own): the same view.
    path("keys/<int:key_id>/budget/", views.key_settings, {"budget_only": True}, name="key_budget"),
]
