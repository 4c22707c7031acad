"""The fleet's records moved from inference to fleet (issue 33) in Django's state only
(fleet/migrations/0001, inference/migrations/0007): a database the server made before
the move keeps its tables as they were and its rows, and the content types and the
permissions granted on them follow the models.

Proved the way an operator meets it: a database migrated by the code of main before the
move (its tree from git, run in a process of its own) with rows in it, then migrated
forward by this code. On SQLite, and on PostgreSQL in the PostgreSQL pass (a scratch
database beside the test database)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

ROOT = Path(__file__).resolve().parents[2]
# main on the day of the move, before it: its migrations end at inference 0006.
BEFORE = "970ee31b72ff1291c1bc39f0891aa53c40e78648"
TABLES = ("inference_worker", "inference_residency", "inference_modelswap")

# Run in either tree by `manage.py shell -c`: what the database holds, as JSON.
SCHEMA = f"""
import json
from django.db import connection
with connection.cursor() as cursor:
    # The inference and fleet tables: other apps may add tables of their own since.
    tables = sorted(t.name for t in connection.introspection.get_table_list(cursor)
                    if t.name.startswith(("inference_", "fleet_")))
    shape = {{t: [[c.name, c.type_code, c.null_ok] for c in
                  connection.introspection.get_table_description(cursor, t)]
             for t in {TABLES!r}}}
    constraints = {{t: connection.introspection.get_constraints(cursor, t) for t in {TABLES!r}}}
print(json.dumps({{"tables": tables, "shape": shape, "constraints": constraints}},
                 default=str, sort_keys=True))
"""

ROWS_BEFORE = """
from django.contrib.auth.models import Group, Permission
from django.utils import timezone
from inference.models import ModelSwap, Residency, Worker
now = timezone.now()
Worker.objects.create(name="w1@host-1", hostname="host-1", pid=41, engine="vllm", model="m",
                      slots_capacity=8, slots_active=3, heartbeat_at=now, held_chunks=[3, 4])
swap = ModelSwap.objects.create(worker="w1@host-1", from_model="e", to_model="m",
                                reason="stretch", decided_at=now, seconds=5.5)
Residency.objects.create(worker="w1@host-1", model="m", epoch=2, swap=swap.id,
                         cannot_start={"x": "too large"})
group = Group.objects.create(name="operators")
group.permissions.add(Permission.objects.get(codename="view_worker"))
"""

ROWS_AFTER = """
import json
from django.contrib.auth.models import Group
from django.contrib.contenttypes.models import ContentType
from fleet.models import ModelSwap, Residency, Worker
print(json.dumps({
    "worker": list(Worker.objects.values_list("name", "pid", "slots_active", "held_chunks")),
    "residency": list(Residency.objects.values_list("worker", "model", "epoch",
                                                   "cannot_start")),
    "swaps": list(ModelSwap.objects.values_list("from_model", "to_model", "seconds")),
    "swap_is_residencys": Residency.objects.get().swap == ModelSwap.objects.get().id,
    "content_types": sorted(ContentType.objects.filter(
        model__in=["worker", "residency", "modelswap"]).values_list("app_label", "model")),
    "granted": [[p.content_type.app_label, p.codename]
                for p in Group.objects.get(name="operators").permissions.all()],
}))
"""


@pytest.fixture
def old_tree(tmp_path) -> Path:
    """The server's code at BEFORE, extracted from this checkout's git history."""
    archive = tmp_path / "before.tar"
    made = subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), BEFORE],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"needs a git checkout holding {BEFORE[:7]}: {made.stderr.strip()}")
    tree = tmp_path / "before"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


@pytest.fixture
def scratch_database(tmp_path):
    """Makes databases of their own for the two trees to migrate: SQLite files, or on
    PostgreSQL databases created beside the test database and dropped after."""
    db = settings.DATABASES["default"]
    made: list[str] = []
    server = {"host": db.get("HOST") or "127.0.0.1", "port": db.get("PORT") or 5432,
              "user": db.get("USER"), "password": db.get("PASSWORD") or None,
              "dbname": "postgres"}

    def make() -> str:
        name = f"fleet_move_{uuid.uuid4().hex[:10]}"
        if not db["ENGINE"].endswith("postgresql"):
            return f"sqlite:///{tmp_path / name}.sqlite3"
        import psycopg

        with psycopg.connect(**server, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        made.append(name)
        password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
        return f"postgres://{db['USER']}{password}@{server['host']}:{server['port']}/{name}"

    yield make
    if made:
        import psycopg

        with psycopg.connect(**server, autocommit=True) as admin:
            for name in made:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def shown(output: str):
    """The JSON a `shell -c` script printed last (the server may log lines before it)."""
    return json.loads(output.strip().splitlines()[-1])


def manage(tree: Path, database_url: str, storage: Path, *args: str) -> str:
    env = {**os.environ, "DATABASE_URL": database_url, "BATCHGEN_STORAGE_PATH": str(storage),
           "DJANGO_SETTINGS_MODULE": "batchgen_site.settings"}
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"manage.py {args[0]} in {tree}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_a_database_made_before_the_move_keeps_its_tables_and_rows(
        old_tree, scratch_database, tmp_path):
    # Given: a database migrated by the code before the move, with a worker, its
    # residency and a swap, and a group granted a permission on workers
    url, storage = scratch_database(), tmp_path / "storage"
    manage(old_tree, url, storage, "migrate", "--noinput")
    manage(old_tree, url, storage, "shell", "-c", ROWS_BEFORE)
    before = shown(manage(old_tree, url, storage, "shell", "-c", SCHEMA))

    # When: this code migrates it forward through the move
    migrated = manage(ROOT, url, storage, "migrate", "--noinput", "inference",
                      "0007_fleet_records_moved_to_fleet")

    # Then: the move ran, and changed no table: the same tables, columns and indexes
    assert "fleet.0001_fleet_records_from_inference... OK" in migrated
    assert "inference.0007_fleet_records_moved_to_fleet... OK" in migrated
    assert shown(manage(ROOT, url, storage, "shell", "-c", SCHEMA)) == before
    # ... and the migrations after it (fleet's own, the other apps') apply on top
    manage(ROOT, url, storage, "migrate", "--noinput")
    assert set(TABLES) <= set(before["tables"])
    # ... every row reads back through fleet's models, and the content types and the
    # permission granted on them followed the models (renamed, not made anew)
    assert shown(manage(ROOT, url, storage, "shell", "-c", ROWS_AFTER)) == {
        "worker": [["w1@host-1", 41, 3, [3, 4]]],
        "residency": [["w1@host-1", "m", 2, {"x": "too large"}]],
        "swaps": [["e", "m", 5.5]],
        "swap_is_residencys": True,
        "content_types": [["fleet", "modelswap"], ["fleet", "residency"], ["fleet", "worker"]],
        "granted": [["fleet", "view_worker"]],
    }


def test_a_new_database_gets_the_tables_an_old_one_has(old_tree, scratch_database, tmp_path):
    # A database made by this code from nothing has the tables, columns and indexes
    # of one made before the move and migrated forward by this code: the move's
    # tables are still inference 0001-0006's, and what came after applies alike.
    old, new, storage = scratch_database(), scratch_database(), tmp_path / "storage"
    manage(old_tree, old, storage, "migrate", "--noinput")
    manage(ROOT, old, storage, "migrate", "--noinput")
    manage(ROOT, new, storage, "migrate", "--noinput")
    schema = shown(manage(ROOT, new, storage, "shell", "-c", SCHEMA))
    assert schema == shown(manage(ROOT, old, storage, "shell", "-c", SCHEMA))
    assert set(TABLES) <= set(schema["tables"])


@pytest.mark.django_db
def test_the_models_and_the_migrations_agree():
    # makemigrations finds nothing to write: fleet's models are what its 0001 says.
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)
