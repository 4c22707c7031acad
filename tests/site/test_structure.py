"""The layering the code keeps (docs/architecture.md, "Layers"), floor by floor from the
bottom: a module imports its own package and the packages on the floors below it,
never one beside it or above it, at the top of a file or inside a function alike.
Where a lower floor needs an answer only a higher one has (which chunks the live
workers hold, say), it declares a hook that the higher floor sets in its
AppConfig.ready. Tasks are published by name, so only tasks.py modules import tasks."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Bottom up. A floor's packages may import the floors below it, never each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("core",),                  # the base: errors, ids, pagination, auth, the Celery app
    ("files",),                 # stored files: uploads, the incremental output
    ("serving",),               # what is served: endpoints, lines, parameters, models, engines
    ("batches",),               # the batch machinery: validate, admit, dispatch, finalize
    ("inference", "webhooks"),  # the worker that runs chunks; the events of finished batches
    ("batchgen_site",),         # the shell: settings, urls, admin pages, metrics, serve
)
FLOOR = {package: floor for floor, packages in enumerate(LAYERS) for package in packages}
# The client, installed without the server's extras: it imports no server package.
CLIENT = "batchgen"


def imports_of(path: Path, root: Path = ROOT, *, names: bool = False) -> list[tuple[int, str]]:
    """(line, module) for every import of a file: at the top, inside a function or
    under TYPE_CHECKING, relative ones resolved, importlib.import_module("...") of a
    literal name too. With `names`, also `module.name` for each `from module import
    name`."""
    parts = path.relative_to(root).with_suffix("").parts
    package = parts if path.name == "__init__.py" else parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else ()
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.append((node.lineno, module))
            if names:
                found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__")):
            found.append((node.lineno, str(node.args[0].value)))
    return sorted(found)


def package_of(module: str) -> str:
    return module.split(".")[0]


def modules(package: str, root: Path = ROOT) -> list[Path]:
    # Migrations and management commands included: modules of their app like any other.
    return sorted((root / package).rglob("*.py"))


def against_the_layers(path: Path, root: Path = ROOT) -> list[str]:
    """The imports of `path` that reach beside or above its package's floor."""
    own = package_of(path.relative_to(root).parts[0])
    wrong = []
    for line, module in imports_of(path, root):
        other = package_of(module)
        if own == CLIENT:
            bad = other in FLOOR
        else:
            bad = other == CLIENT or (other in FLOOR and other != own
                                      and FLOOR[other] >= FLOOR[own])
        if bad:
            wrong.append(f"{path.relative_to(root)}:{line} imports {module}")
    return wrong


def shipped_packages() -> list[str]:
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())[
        "tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted(pattern.removesuffix("*") for pattern in include)


def test_the_layers_name_every_package_that_ships():
    assert sorted([*FLOOR, CLIENT]) == shipped_packages()
    assert [package for package in [*FLOOR, CLIENT]
            if not (ROOT / package / "__init__.py").is_file()] == []


def test_no_module_imports_beside_or_above_its_floor():
    wrong = [text for package in [*FLOOR, CLIENT] for path in modules(package)
             for text in against_the_layers(path)]
    assert wrong == []


def test_an_import_against_the_layers_is_found_however_it_is_written(tmp_path):
    # The check itself: a module of `serving` reaching beside or above its floor in
    # each way an import can be written is caught every time; its own package and
    # the floors below pass.
    source = tmp_path / "serving" / "sub" / "probe.py"
    source.parent.mkdir(parents=True)
    source.write_text(
        "import importlib\n"
        "from typing import TYPE_CHECKING\n"
        "from serving.params import Bound\n"
        "from files import storage\n"
        "if TYPE_CHECKING:\n"
        "    from inference.models import Worker\n"
        "def late():\n"
        "    import batches.models\n"
        "    from webhooks import services\n"
        "    return importlib.import_module('batchgen_site.urls')\n"
        "from .. import params\n"
        "from batchgen import BatchGenClient\n")
    client = tmp_path / "batchgen" / "probe.py"
    client.parent.mkdir()
    client.write_text("from core.errors import NotFound\n")

    assert against_the_layers(source, tmp_path) == [
        f"serving/sub/probe.py:{line} imports {module}" for line, module in [
            (6, "inference.models"), (8, "batches.models"), (9, "webhooks"),
            (10, "batchgen_site.urls"), (12, "batchgen")]]
    assert against_the_layers(client, tmp_path) == ["batchgen/probe.py:1 imports core.errors"]


def test_only_tasks_modules_import_tasks():
    offenders = sorted(
        f"{path.relative_to(ROOT)}:{line}"
        for package in FLOOR for path in modules(package) if path.name != "tasks.py"
        for line, name in imports_of(path, names=True)
        if package_of(name) in FLOOR and name.split(".")[1:2] == ["tasks"])
    assert offenders == []
