from django.db import migrations


def create_default_plan(apps, schema_editor):
    Plan = apps.get_model("accounts", "Plan")
    Plan.objects.get_or_create(name="default")


class Migration(migrations.Migration):
    dependencies = [("accounts", "0001_initial")]

    operations = [migrations.RunPython(create_default_plan, migrations.RunPython.noop)]
