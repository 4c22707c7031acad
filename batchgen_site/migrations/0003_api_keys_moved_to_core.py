# API keys and their daily usage now belong to core (core/migrations/0001, issue 29):
# batchgen_site forgets them, in Django's state only. Their tables stay, under the
# same names, owned by core's models; nothing is dropped.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('batchgen_site', '0002_key_quotas_and_daily_usage'),
        ('core', '0001_api_keys_from_batchgen_site'),
        # Every foreign key to the key model points at core's first.
        ('batches', '0013_owner_in_core'),
        ('files', '0004_owner_in_core'),
        ('webhooks', '0002_owner_in_core'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name='KeyUsage'),
                migrations.DeleteModel(name='ApiKey'),
            ],
            database_operations=[],
        ),
    ]
