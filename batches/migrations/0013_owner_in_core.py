# The owner's key model moved to core (core/migrations/0001): state only, as the
# column and its foreign key name the same table (batchgen_site_apikey) before and
# after, so nothing is altered in the database (SQLite would rebuild the table).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('batches', '0012_endpoint_responses'),
        ('core', '0001_api_keys_from_batchgen_site'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='batch',
                    name='owner',
                    field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='core.apikey'),
                ),
            ],
            database_operations=[],
        ),
    ]
