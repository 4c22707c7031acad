from django.db import migrations


def create_pool(apps, schema_editor):
    apps.get_model("batches", "IntakePool").objects.get_or_create(id=1)


class Migration(migrations.Migration):
    dependencies = [("batches", "0001_initial")]
    operations = [migrations.RunPython(create_pool, migrations.RunPython.noop)]
