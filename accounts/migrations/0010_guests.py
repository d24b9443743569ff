from django.db import migrations, models

# accounts.models.GUEST_PLAN_LIMITS as it was when this migration was written.
GUEST_PLAN_LIMITS = {
    "requests_per_minute": 5,
    "tokens_per_day": 5_000,
    "max_concurrent_streams": 1,
    "max_tokens_per_request": 256,
    "priority": -1,
    "max_documents_per_conversation": 0,
    "max_conversations": 1,
}


def create_guest_plan(apps, schema_editor):
    Plan = apps.get_model("accounts", "Plan")
    Plan.objects.get_or_create(name="guest", defaults=GUEST_PLAN_LIMITS)


class Migration(migrations.Migration):
    dependencies = [("accounts", "0009_account_ledger_day")]

    operations = [
        migrations.AddField(
            model_name="account",
            name="guest_address",
            field=models.GenericIPAddressField(blank=True, db_index=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="account",
            name="is_guest",
            field=models.BooleanField(default=False, editable=False, verbose_name="guest"),
        ),
        migrations.AddField(
            model_name="plan",
            name="max_conversations",
            field=models.PositiveIntegerField(
                blank=True, help_text="Conversations a user of this plan may keep. Blank: no limit.", null=True
            ),
        ),
        # Going back leaves the plan in place: users may be on it.
        migrations.RunPython(create_guest_plan, migrations.RunPython.noop),
    ]
