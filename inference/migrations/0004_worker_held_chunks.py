from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('inference', '0003_worker_storage_error'),
    ]

    operations = [
        migrations.AddField(
            model_name='worker',
            name='held_chunks',
            field=models.JSONField(blank=True, default=list),
        ),
    ]
