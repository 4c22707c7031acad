# The fleet's records (Worker, Residency, ModelSwap) move from inference to fleet
# (issue 33) without touching the database, as the API keys moved to core (core
# 0001): the tables keep their names (db_table inference_*), so this migration only
# tells Django's state that fleet now owns them. inference/migrations/0007 then forgets
# them there. On a fresh database inference 0001-0006 create the tables.

from django.db import migrations, models

MOVED = ("worker", "residency", "modelswap")


def content_types_to(app_label_from, app_label_to):
    """The content types (and so the permissions granted on them, and the admin's
    history) follow the models: renamed in place, not created anew."""

    def rename(apps, schema_editor):
        content_type = apps.get_model("contenttypes", "ContentType")
        rows = content_type.objects.using(schema_editor.connection.alias)
        for model in MOVED:
            if not rows.filter(app_label=app_label_to, model=model).exists():
                rows.filter(app_label=app_label_from, model=model).update(
                    app_label=app_label_to)

    return rename


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('inference', '0006_residency_cannot_start'),
        ('contenttypes', '0002_remove_content_type_name'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='Worker',
                    fields=[
                        ('name', models.CharField(max_length=255, primary_key=True, serialize=False)),
                        ('hostname', models.CharField(max_length=255)),
                        ('pid', models.IntegerField()),
                        ('engine', models.CharField(max_length=32)),
                        ('model', models.CharField(max_length=255)),
                        ('slots_capacity', models.IntegerField()),
                        ('slots_active', models.IntegerField(default=0)),
                        ('tokens_active', models.BigIntegerField(default=0)),
                        ('token_budget', models.BigIntegerField(blank=True, null=True)),
                        ('ready', models.BooleanField(default=False)),
                        ('requests_completed', models.BigIntegerField(default=0)),
                        ('requests_failed', models.BigIntegerField(default=0)),
                        ('tokens_generated', models.BigIntegerField(default=0)),
                        ('started_at', models.DateTimeField(auto_now_add=True)),
                        ('heartbeat_at', models.DateTimeField(db_index=True)),
                        ('stopped_at', models.DateTimeField(blank=True, null=True)),
                        ('storage_error', models.TextField(blank=True, default='')),
                        ('held_chunks', models.JSONField(blank=True, default=list)),
                    ],
                    options={
                        'db_table': 'inference_worker',
                    },
                ),
                migrations.CreateModel(
                    name='Residency',
                    fields=[
                        ('worker', models.CharField(max_length=255, primary_key=True, serialize=False)),
                        ('model', models.CharField(blank=True, default='', max_length=255)),
                        ('epoch', models.IntegerField(default=0)),
                        ('assigned_at', models.DateTimeField(auto_now_add=True)),
                        ('swap', models.BigIntegerField(blank=True, null=True)),
                        ('cannot_start', models.JSONField(blank=True, default=dict)),
                    ],
                    options={
                        'db_table': 'inference_residency',
                    },
                ),
                migrations.CreateModel(
                    name='ModelSwap',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('worker', models.CharField(max_length=255)),
                        ('from_model', models.CharField(blank=True, default='', max_length=255)),
                        ('to_model', models.CharField(max_length=255)),
                        ('reason', models.CharField(max_length=32)),
                        ('decided_at', models.DateTimeField(db_index=True)),
                        ('started_at', models.DateTimeField(blank=True, null=True)),
                        ('finished_at', models.DateTimeField(blank=True, null=True)),
                        ('drain_seconds', models.FloatField(blank=True, null=True)),
                        ('seconds', models.FloatField(blank=True, null=True)),
                        ('error', models.TextField(blank=True, default='')),
                    ],
                    options={
                        'db_table': 'inference_modelswap',
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(content_types_to('inference', 'fleet'),
                             content_types_to('fleet', 'inference')),
    ]
