"""docs/architecture.md, section 5, "Which package imports which": the table is read from the
docs and checked against every ``import`` statement in ``src/attnkit`` (top-level and inside
functions), so the documented layering cannot drift from the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "attnkit"
ROOT_PACKAGE = "attnkit"  # ``import attnkit`` (for attnkit.__version__): allowed anywhere


def documented_layers() -> dict[str, tuple[int, set[str] | None]]:
    """unit -> (row, the units it may import; None for "everything above")."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## 5. Which package imports which", 1)[1].split("\n## ", 1)[0]
    layers = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].isdigit():
            continue
        row, units, imports = int(cells[0]), cells[1], cells[2]
        if imports.startswith("everything above"):
            allowed = None
        else:
            allowed = set(re.findall(r"`([\w.]+)`", re.sub(r"\([^)]*\)", "", imports)))
        for unit in re.findall(r"`([\w.]+)/?`", units):
            layers[unit.removesuffix(".py")] = (row, allowed)
    return layers


def imported_units() -> dict[str, set[str]]:
    """unit (top-level module or package of attnkit) -> the other units its files import."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).parts
        if parts == ("__init__.py",):
            continue  # the package's names, imported lazily by name on first use (PEP 562)
        unit = parts[0] if len(parts) > 1 else path.stem
        names = found.setdefault(unit, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path}: a relative import"
                if node.module == "attnkit":  # the package's names, or its subpackages
                    names.update(
                        ROOT_PACKAGE if a.name.startswith("__") else a.name for a in node.names
                    )
                elif node.module and node.module.startswith("attnkit."):
                    names.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == ROOT_PACKAGE:
                        names.add(ROOT_PACKAGE)
                    elif a.name.startswith("attnkit."):
                        names.add(a.name.split(".")[1])
        names.discard(unit)
        names.discard(ROOT_PACKAGE)  # its __version__: attnkit/__init__.py imports nothing
    return found


def test_the_table_names_every_module_and_package():
    layers, code = documented_layers(), imported_units()
    assert set(code) - set(layers) == set(), "units of src/attnkit missing from the table"
    assert set(layers) - set(code) == set(), "table rows naming no module of src/attnkit"


def test_every_unit_imports_exactly_what_its_row_lists():
    layers, code = documented_layers(), imported_units()
    for unit, names in code.items():
        row, allowed = layers[unit]
        if allowed is None:  # "everything above"
            below = {u for u, (r, _) in layers.items() if r < row}
            assert names - below == set(), f"{unit} imports from its row or above"
        else:
            assert names == allowed, f"{unit}: imports {sorted(names)}, table {sorted(allowed)}"


def test_no_import_runs_upward():
    layers = documented_layers()
    for unit, (row, allowed) in layers.items():
        for name in allowed or ():
            other = layers[name][0]
            same_row_ok = row == 0 and unit == "attention_short"  # the docs' one exception
            assert other < row or (other == row and same_row_ok), f"{unit} -> {name}"
