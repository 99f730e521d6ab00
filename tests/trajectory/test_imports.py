"""The package must not need numpy: no trajectory module imports it at module level."""

from __future__ import annotations

import ast
from pathlib import Path

import trio_swe.trajectory

PACKAGE = Path(trio_swe.trajectory.__file__).parent


def module_level_imports(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:  # top level only; TYPE_CHECKING blocks and functions are fine
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_no_module_level_numpy_import() -> None:
    files = sorted(PACKAGE.glob("*.py"))
    assert len(files) >= 6
    for path in files:
        imported = module_level_imports(ast.parse(path.read_text()))
        assert not imported & {"numpy", "torch"}, path.name
