"""The public names of ``trio_swe`` load on first use, and every one of them still loads."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import trio_swe


def _type_checking_imports() -> dict[str, tuple[str, ...]]:
    """The imports under ``if TYPE_CHECKING:`` in trio_swe/__init__.py (what mypy reads)."""
    tree = ast.parse(Path(trio_swe.__file__).read_text())
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
    )
    out: dict[str, tuple[str, ...]] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom)
        out["." * node.level + (node.module or "")] = tuple(a.name for a in node.names)
    return out


def test_the_type_checkers_names_are_the_interpreters() -> None:
    typed = _type_checking_imports()
    assert typed.pop(".") == ("aio",)  # a submodule: found by name
    assert typed == trio_swe._ORIGINS
    assert sorted(trio_swe.__all__) == sorted({"aio", *trio_swe._NAMED})


@pytest.mark.parametrize("name", trio_swe.__all__)
def test_every_public_name_is_its_modules_object(name: str) -> None:
    value = getattr(trio_swe, name)
    if name == "aio":
        assert value is importlib.import_module("trio_swe.aio")
    else:
        origin = importlib.import_module(trio_swe._NAMED[name], "trio_swe")
        assert value is getattr(origin, name)
    assert name in dir(trio_swe)


def test_subpackages_load_by_name_and_unknown_names_are_attribute_errors() -> None:
    assert trio_swe.grading is importlib.import_module("trio_swe.grading")
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        trio_swe.no_such_name  # type: ignore[attr-defined]  # noqa: B018
    assert not hasattr(trio_swe, "__wrapped__")


def _imported_by(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_importing_the_package_or_the_console_entry_imports_nothing_heavy() -> None:
    # The console script imports trio_swe.cli before its entry can take Ctrl-C over: the
    # shorter that is, the shorter the time a Ctrl-C still prints a traceback (issue 27).
    for statement in ("import trio_swe", "from trio_swe.cli import console"):
        loaded = _imported_by(statement)
        assert {"trio", "rich", "httpx", "msgspec"}.isdisjoint(loaded), statement
        ours = {m for m in loaded if m.startswith("trio_swe")}
        assert ours <= {"trio_swe", "trio_swe.cli", "trio_swe.cli._entry"}, statement
