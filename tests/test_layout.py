"""The suite's layout holds: what tests share lives in tests/support (or a conftest), never
in a test module another imports; and a test's tier is its markers alone, so no file is
named for one (docs/development.md#test-tiers)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted([*(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")])


def imported_modules(path: Path) -> set[str]:
    """The modules ``path`` imports (``from tests.x import y`` names ``tests.x`` and, when
    ``y`` is a module, ``tests.x.y``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def is_test_module(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "tests" and parts[-1].startswith("test_")


def test_no_test_module_is_imported_by_another() -> None:
    imports = {
        f"{path.relative_to(ROOT)} imports {module}"
        for path in SOURCES
        for module in imported_modules(path)
        if is_test_module(module)
    }
    assert not imports, "move what they share to tests/support: " + "; ".join(sorted(imports))


def test_no_test_file_is_named_for_a_tier() -> None:
    named = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("test_*.py")
        if path.stem.endswith(("_unit", "_cluster"))
    ]
    assert not named, "a tier is a marker (postgres, slurm, kube, deploy), not a file name"
