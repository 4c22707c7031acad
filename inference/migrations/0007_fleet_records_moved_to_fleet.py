# The fleet's records now belong to fleet (fleet/migrations/0001, issue 33): inference
# forgets them, in Django's state only. Their tables stay, under the same names, owned
# by fleet's models; nothing is dropped.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('inference', '0006_residency_cannot_start'),
        ('fleet', '0001_fleet_records_from_inference'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name='ModelSwap'),
                migrations.DeleteModel(name='Residency'),
                migrations.DeleteModel(name='Worker'),
            ],
            database_operations=[],
        ),
    ]
