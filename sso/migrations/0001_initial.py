import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("accounts", "0001_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ClaimMapping",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "claim",
                    models.CharField(
                        default="groups",
                        help_text="The claim's name in the ID token or user info, e.g. groups.",
                        max_length=100,
                    ),
                ),
                (
                    "value",
                    models.CharField(
                        help_text="Matches a claim equal to this, or a list claim holding it (Keycloak's groups: /interns).",
                        max_length=255,
                    ),
                ),
                (
                    "is_staff",
                    models.BooleanField(
                        default=False, help_text="Staff status (the admin) while it matches.", verbose_name="staff"
                    ),
                ),
                (
                    "order",
                    models.PositiveIntegerField(
                        default=0, help_text="Lower first: the first matching row's plan counts."
                    ),
                ),
                (
                    "plan",
                    models.ForeignKey(
                        blank=True,
                        help_text="The plan this gives. Blank: no plan from this row.",
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="claim_mappings",
                        to="accounts.plan",
                    ),
                ),
            ],
            options={
                "ordering": ["order", "id"],
                "constraints": [models.UniqueConstraint(fields=("claim", "value"), name="sso_claim_mapping_unique")],
            },
        ),
        migrations.CreateModel(
            name="Identity",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("issuer", models.CharField(max_length=255)),
                ("subject", models.CharField(max_length=255)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("last_login_at", models.DateTimeField(blank=True, null=True)),
                (
                    "user",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="sso_identities",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "verbose_name_plural": "identities",
                "constraints": [models.UniqueConstraint(fields=("issuer", "subject"), name="sso_identity_unique")],
            },
        ),
    ]
