"""The package's floors: every module imports only its own floor or floors below, as docs/architecture.md states.

The floor order is written once, in the table of docs/architecture.md's "Layout" section (top floor first); this
test reads it from there, checks that it covers the tree exactly, and walks every import of every module, function-level
imports included. It also holds the size limits that keep modules readable in an afternoon.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "posleak"
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 400


def layout_floors(text: str) -> list[tuple[str, list[str]]]:
    """(floor, paths) from the layout table of docs/architecture.md, bottom floor first."""
    section = text.split("\n## Layout", 1)[1].split("\n## ", 1)[0]
    floors = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        paths = re.findall(r"`(posleak/[^`]*)`", cells[1]) if line.startswith("|") and len(cells) >= 2 else []
        if paths:
            floors.append((cells[0].strip("*"), paths))
    return floors[::-1]


def floor_of(path: str, floors: list[tuple[str, list[str]]]) -> int | None:
    """The index of the floor holding the file `path` (relative to the root): the longest matching entry."""
    best: tuple[int, int] | None = None
    for index, (_, entries) in enumerate(floors):
        for entry in entries:
            if path == entry or (entry.endswith("/") and path.startswith(entry)):
                if best is None or len(entry) > best[1]:
                    best = (index, len(entry))
    return None if best is None else best[0]


def module_path(module: str) -> str | None:
    """The file (relative to the root) of a posleak module name; None for other packages."""
    if module != "posleak" and not module.startswith("posleak."):
        return None
    base = ROOT / module.replace(".", "/")
    return str((base / "__init__.py" if base.is_dir() else base.with_suffix(".py")).relative_to(ROOT))


def imported_modules(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, module) for every import in `source`, relative imports resolved against `module`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            name = node.module or ""
            if node.level:
                parts = module.split(".")[: len(module.split(".")) - node.level + is_package]
                name = ".".join([*parts, name] if name else parts)
            found.append((node.lineno, name))
    return found


def upward_imports(path: str, source: str, floors: list[tuple[str, list[str]]]) -> list[str]:
    """Each import of the file `path` that reaches a floor above its own, as 'path:line: module (floor > floor)'."""
    own = floor_of(path, floors)
    assert own is not None, f"{path} is on no floor of the layout of docs/architecture.md"
    module = path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    problems = []
    for line, target in imported_modules(source, module, path.endswith("__init__.py")):
        target_path = module_path(target)
        target_floor = None if target_path is None else floor_of(target_path, floors)
        if target_floor is not None and target_floor > own:
            problems.append(f"{path}:{line}: {target} ({floors[target_floor][0]} above {floors[own][0]})")
    return problems


def package_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py"))


FLOORS = layout_floors((ROOT / "docs" / "architecture.md").read_text())


def test_the_layout_covers_the_tree_exactly() -> None:
    assert len(FLOORS) >= 10, "the layout of docs/architecture.md table was not found"
    entries = [entry for _, paths in FLOORS for entry in paths]
    assert len(entries) == len(set(entries)), "a path is on two floors"
    missing = [entry for entry in entries if not (ROOT / entry).exists()]
    assert not missing, f"the layout of docs/architecture.md names paths that do not exist: {missing}"
    unplaced = [path for path in package_files() if floor_of(path, FLOORS) is None]
    assert not unplaced, f"modules on no floor of the layout of docs/architecture.md: {unplaced}"
    folders = {str(p.relative_to(ROOT)) + "/" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    unnamed = sorted(folders - set(entries))
    assert not unnamed, f"packages the layout of docs/architecture.md does not name: {unnamed}"


def test_no_module_imports_a_floor_above_its_own() -> None:
    problems = [
        problem for path in package_files() for problem in upward_imports(path, (ROOT / path).read_text(), FLOORS)
    ]
    assert not problems, "imports that run back up the floors:\n" + "\n".join(problems)


def test_the_floor_check_catches_an_upward_import() -> None:
    """The checker itself: a store module importing the pipeline, at module level or inside a function, or
    relatively, is caught; an import from below is not."""
    down = "from posleak.errors import PosleakError\n"
    up = "def f():\n    from posleak.pipeline import AnalyzeConfig\n"
    relative = "from ..pipeline import AnalyzeConfig\n"
    assert upward_imports("posleak/store/runfolder.py", down, FLOORS) == []
    assert len(upward_imports("posleak/store/runfolder.py", up, FLOORS)) == 1
    assert len(upward_imports("posleak/store/runfolder.py", relative, FLOORS)) == 1
    assert upward_imports("posleak/cli/__init__.py", up, FLOORS) == []


def test_functions_and_modules_stay_short() -> None:
    long_modules, long_functions = [], []
    for path in package_files():
        source = (ROOT / path).read_text()
        if len(source.splitlines()) > MAX_MODULE_LINES:
            long_modules.append(f"{path}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if node.end_lineno is not None and node.end_lineno - start + 1 > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path}:{node.lineno}: {node.name}, {node.end_lineno - start + 1} lines")
    assert not long_modules, f"modules over {MAX_MODULE_LINES} lines: {long_modules}"
    assert not long_functions, f"functions over {MAX_FUNCTION_LINES} lines: {long_functions}"


def test_the_package_docstring_gives_the_floors_in_the_layouts_order() -> None:
    doc = " ".join((PACKAGE / "__init__.py").read_text().split('"""')[1].split())
    assert " → ".join(name for name, _ in FLOORS) in doc, "posleak/__init__.py's floor order is not the layout's"
