"""The size the code keeps (STYLE.md: "files of a few hundred lines at most; functions
that fit on a screen"; issue 33): no class over 250 lines and no function over 60 in
shipped code, migrations aside (Django writes them). A class that outgrows the limit
wants splitting by role, as InferenceRuntime was (inference/runtime.py); there is no
allow-list."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.site.test_structure import ROOT, shipped_packages

MAX_CLASS_LINES = 250
MAX_FUNCTION_LINES = 60
ALLOWED: frozenset[str] = frozenset()  # "path:Name" of an exception; keep it empty


def shipped_modules(root: Path = ROOT) -> list[Path]:
    return sorted(path for package in shipped_packages() for path in (root / package).rglob("*.py")
                  if "migrations" not in path.relative_to(root).parts)


def oversized(path: Path, root: Path = ROOT) -> list[str]:
    """"path:Name (kind, lines)" for each class or function of `path` over its limit,
    nested ones included (a method is a function); decorators count."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ClassDef):
            kind, limit = "class", MAX_CLASS_LINES
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            kind, limit = "function", MAX_FUNCTION_LINES
        else:
            continue
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        lines = node.end_lineno - first + 1
        name = f"{path.relative_to(root)}:{node.name}"
        if lines > limit and name not in ALLOWED:
            found.append(f"{name} ({kind}, {lines} lines)")
    return found


def test_no_class_or_function_in_shipped_code_is_over_its_size():
    assert [text for path in shipped_modules() for text in oversized(path)] == []


def test_the_size_check_finds_a_long_class_and_a_long_method(tmp_path):
    # The check itself: a method one line over the limit, in a class one line over
    # its own, is caught twice; the short function beside them is not.
    body = "".join(f"        x = {i}\n" for i in range(MAX_FUNCTION_LINES - 1))
    padding = "".join(f"    y{i} = {i}\n" for i in range(MAX_CLASS_LINES - MAX_FUNCTION_LINES - 1))
    source = tmp_path / "probe.py"
    source.write_text("class Big:\n" + padding + "    @staticmethod\n    def long():\n" + body
                      + "def short():\n    return 1\n")

    assert oversized(source, tmp_path) == [
        f"probe.py:Big (class, {MAX_CLASS_LINES + 1} lines)",
        f"probe.py:long (function, {MAX_FUNCTION_LINES + 1} lines)"]
