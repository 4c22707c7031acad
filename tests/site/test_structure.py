"""The dependency direction the code keeps (docs/architecture.md, "Structure"): the
inference worker depends on the batch machinery, never the reverse, and tasks are
published by name, so only tasks.py modules import tasks."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APPS = ("batches", "files", "inference", "batchgen_site", "webhooks")
# What the server serves (the model's facts, read from its folder): a leaf that
# imports no app. It moves to the engine registry (issue 14).
ALLOWED_FROM_BATCHES = {"serving.model_info"}


def imports_of(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def modules(app: str) -> list[Path]:
    return [p for p in (ROOT / app).rglob("*.py") if "migrations" not in p.parts]


def test_the_batch_machinery_never_imports_the_inference_worker():
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            name for name in imports_of(path)
            if name.split(".")[0] == "inference" and name not in ALLOWED_FROM_BATCHES
            and not any(name.startswith(f"{allowed}.") for allowed in ALLOWED_FROM_BATCHES))
        for path in modules("batches") + modules("files")
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_only_tasks_modules_import_tasks():
    offenders = sorted(
        str(path.relative_to(ROOT))
        for app in APPS for path in modules(app)
        if path.name != "tasks.py"
        and any(name.split(".")[1:2] == ["tasks"] for name in imports_of(path)
                if name.split(".")[0] in APPS)
    )
    assert offenders == []


def test_the_batch_machinery_never_imports_webhooks():
    # Webhooks hear of batches by the batch_finished signal (batches/signals.py).
    offenders = sorted(
        str(path.relative_to(ROOT))
        for app in ("batches", "files", "inference") for path in modules(app)
        if any(name.split(".")[0] == "webhooks" for name in imports_of(path)))
    assert offenders == []
