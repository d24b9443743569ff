from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class TwoFactorConfig(AppConfig):
    name = "twofactor"
    default = True  # this module holds the admin's config too
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "two-factor log-in"


class TwoFactorAdminConfig(admin_apps.AdminConfig):
    """Django's admin, on a site that asks staff with an authenticator for a code (twofactor.admin_site)."""

    default = False
    default_site = "twofactor.admin_site.TwoFactorAdminSite"
