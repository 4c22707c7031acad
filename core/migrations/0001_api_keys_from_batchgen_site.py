# API keys and their daily usage move from batchgen_site to core (issue 29) without
# touching the database: the tables keep their names (db_table), so this migration
# only tells Django's state that core now owns them. batchgen_site/migrations/0003
# then forgets them there, once every foreign key points here (files 0004, batches
# 0013, webhooks 0002). On a fresh database batchgen_site 0001-0002 create the tables.

import django.core.validators
import django.db.models.deletion
from django.db import migrations, models

MOVED = ("apikey", "keyusage")


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
        ('batchgen_site', '0002_key_quotas_and_daily_usage'),
        ('contenttypes', '0002_remove_content_type_name'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='ApiKey',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('name', models.CharField(max_length=100)),
                        ('prefix', models.CharField(max_length=16)),
                        ('hashed_key', models.CharField(max_length=64, unique=True)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('last_used_at', models.DateTimeField(blank=True, null=True)),
                        ('revoked_at', models.DateTimeField(blank=True, null=True)),
                        ('max_intake_requests', models.PositiveIntegerField(blank=True, help_text="Most requests this key's batches may hold in the intake pool at once (empty: no limit).", null=True)),
                        ('tokens_per_day', models.PositiveBigIntegerField(blank=True, help_text="Input plus output tokens per UTC day; new batches are refused once today's usage reaches it (empty: no limit).", null=True)),
                        ('weight', models.PositiveIntegerField(default=1, help_text="Fair-share weight against other keys (1 to 1000); a batch's metadata.priority divides the key's share among its batches.", validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(1000)])),
                    ],
                    options={
                        'verbose_name': 'API key',
                        'db_table': 'batchgen_site_apikey',
                    },
                ),
                migrations.CreateModel(
                    name='KeyUsage',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('day', models.DateField()),
                        ('requests_completed', models.BigIntegerField(default=0)),
                        ('requests_failed', models.BigIntegerField(default=0)),
                        ('input_tokens', models.BigIntegerField(default=0)),
                        ('cached_tokens', models.BigIntegerField(default=0)),
                        ('output_tokens', models.BigIntegerField(default=0)),
                        ('reasoning_tokens', models.BigIntegerField(default=0)),
                        ('key', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='usage_days', to='core.apikey')),
                    ],
                    options={
                        'verbose_name': 'API key usage (per day)',
                        'verbose_name_plural': 'API key usage (per day)',
                        'db_table': 'batchgen_site_keyusage',
                        'ordering': ['-day', 'key_id'],
                        'indexes': [models.Index(fields=['day'], name='key_usage_day')],
                        'constraints': [models.UniqueConstraint(fields=('key', 'day'), name='key_usage_unique_day')],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(content_types_to('batchgen_site', 'core'),
                             content_types_to('core', 'batchgen_site')),
    ]
