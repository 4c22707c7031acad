from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('batches', '0019_output_limit_done'),
    ]

    operations = [
        migrations.AddField(
            model_name='chunk',
            name='admitted_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
