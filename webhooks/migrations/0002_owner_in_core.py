# The owner's key model moved to core (core/migrations/0001): state only, as the
# column and its foreign key name the same table (batchgen_site_apikey) before and
# after, so nothing is altered in the database (SQLite would rebuild the table).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('webhooks', '0001_webhook_endpoints_and_deliveries'),
        ('core', '0001_api_keys_from_batchgen_site'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='webhookendpoint',
                    name='owner',
                    field=models.ForeignKey(blank=True, help_text="Empty: server-wide, sent every batch's events.", null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='core.apikey'),
                ),
            ],
            database_operations=[],
        ),
    ]
