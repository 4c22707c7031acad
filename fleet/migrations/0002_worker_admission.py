from django.db import migrations, models


class Migration(migrations.Migration):
    """An openai-http worker's adaptive concurrency, as of its heartbeat
    (inference/adaptive.py): its limit and the server signals it read."""

    dependencies = [
        ('fleet', '0001_fleet_records_from_inference'),
    ]

    operations = [
        migrations.AddField(
            model_name='worker',
            name='admission',
            field=models.JSONField(blank=True, null=True),
        ),
    ]
