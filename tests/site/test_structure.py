"""The layering the code keeps (docs/architecture.md, "Layers"), floor by floor from the
bottom: a module imports its own package and the packages on the floors below it,
never one beside it or above it, at the top of a file or inside a function alike.
A lower floor owns the rows it is asked about (the fleet's records sit below the batch
machinery), and what it must ask a higher floor it asks by Django signal; no package
assigns another package's module globals (no hooks patched at start-up). Tasks are
published by name, so only tasks.py modules import tasks."""

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
    ("fleet",),                 # the fleet's records: workers, residency, swaps; the policy
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


def test_the_fleet_sits_below_the_batch_machinery_and_above_serving(tmp_path):
    # batches reads the fleet's records plainly; the fleet, asked by batches, never
    # asks it back (nor the worker), lazily or not.
    fleet = tmp_path / "fleet" / "probe.py"
    fleet.parent.mkdir()
    fleet.write_text("from serving.model_info import served_models\n"
                     "def late():\n"
                     "    from batches.models import Chunk\n"
                     "    import inference.runtime\n")
    batches = tmp_path / "batches" / "probe.py"
    batches.parent.mkdir()
    batches.write_text("from fleet import selectors\nfrom fleet.models import Worker\n")

    assert against_the_layers(fleet, tmp_path) == [
        "fleet/probe.py:3 imports batches.models", "fleet/probe.py:4 imports inference.runtime"]
    assert against_the_layers(batches, tmp_path) == []


def test_only_tasks_modules_import_tasks():
    offenders = sorted(
        f"{path.relative_to(ROOT)}:{line}"
        for package in FLOOR for path in modules(package) if path.name != "tasks.py"
        for line, name in imports_of(path, names=True)
        if package_of(name) in FLOOR and name.split(".")[1:2] == ["tasks"])
    assert offenders == []


def module_of(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if path.name == "__init__.py" else parts)


def is_module(name: str, root: Path = ROOT) -> bool:
    base = root.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def foreign_global_assignments(path: Path, root: Path = ROOT) -> list[str]:
    """The statements of `path` that assign a module global of another package:
    `module.NAME = ...` (or +=, or annotated), `setattr(module, "NAME", ...)`, the
    module named by `import a.b [as x]`, `from a import b` or an attribute chain of
    them. What a module owns it sets itself; a package that needs an answer from
    another imports it (below) or hears it by signal (above)."""
    own = package_of(module_of(path, root))
    tree = ast.parse(path.read_text(), str(path))
    names: dict[str, str] = {}  # a local name -> the module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    names[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if is_module(f"{node.module}.{alias.name}", root):
                    names[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def module(expr: ast.expr) -> str | None:
        if isinstance(expr, ast.Name):
            return names.get(expr.id)
        if isinstance(expr, ast.Attribute):
            base = module(expr.value)
            if base and is_module(f"{base}.{expr.attr}", root):
                return f"{base}.{expr.attr}"
        return None

    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [t for target in node.targets
                       for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr"
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
            owner = module(node.args[0])
            if owner and package_of(owner) in FLOOR and package_of(owner) != own:
                found.append((node.lineno, f"{owner}.{node.args[1].value}"))
            continue
        for target in targets:
            owner = module(target.value) if isinstance(target, ast.Attribute) else None
            if owner and package_of(owner) in FLOOR and package_of(owner) != own:
                found.append((node.lineno, f"{owner}.{target.attr}"))
    return [f"{path.relative_to(root)}:{line} sets {name}" for line, name in sorted(found)]


def test_no_package_assigns_another_packages_module_globals():
    wrong = [text for package in [*FLOOR, CLIENT] for path in modules(package)
             for text in foreign_global_assignments(path)]
    assert wrong == []


def test_an_assignment_to_another_packages_global_is_found_however_it_is_written(tmp_path):
    # The check itself, on a tree of its own: the hooks issue 33 removed, written each
    # way Python allows, are caught; a package's own globals and objects' attributes pass.
    for module in ("batches/__init__.py", "batches/dispatch.py", "batches/recovery.py",
                   "files/__init__.py", "files/services.py", "inference/__init__.py"):
        (tmp_path / module).parent.mkdir(exist_ok=True)
        (tmp_path / module).write_text("")
    probe = tmp_path / "inference" / "apps.py"
    probe.write_text(
        "import files.services\n"
        "import batches.recovery as rec\n"
        "from batches import dispatch\n"
        "import batches\n"
        "from inference import apps\n"
        "def ready(self, hook):\n"
        "    dispatch.window_source = hook\n"
        "    files.services.in_active_use = hook\n"
        "    rec.held_source: object = hook\n"
        "    setattr(batches.dispatch, 'window_source', hook)\n"
        "    batches.recovery.LOST_AFTER += 1\n"
        "    apps.LOCAL = hook\n"
        "    self.window_source = hook\n")

    assert foreign_global_assignments(probe, tmp_path) == [
        f"inference/apps.py:{line} sets {name}" for line, name in [
            (7, "batches.dispatch.window_source"), (8, "files.services.in_active_use"),
            (9, "batches.recovery.held_source"), (10, "batches.dispatch.window_source"),
            (11, "batches.recovery.LOST_AFTER")]]
