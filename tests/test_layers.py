"""The package's layer order, as its docstring writes it, held by every import in rkstudy/: a module
imports from its own layer or an earlier one, never a later one (lazy imports inside functions count:
they run just the same). No exceptions list: a needed upward import means something sits in the wrong
layer."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import rkstudy

PACKAGE = Path(rkstudy.__file__).parent


def layers() -> dict[str, int]:
    """{top-level module or package: its layer index}, from the indented table in the docstring."""
    table = re.findall(r"^    ((?:[a-z_]+ ?)+?)\s{2,}\S", rkstudy.__doc__, flags=re.M)
    assert len(table) >= 10, table
    return {name: i for i, row in enumerate(table) for name in row.split()}


def room(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def imported_rooms(path: Path, text: str | None = None):
    """(line, top-level module) of every rkstudy import in `path` (or in `text`, as if it were that
    file), relative or absolute."""
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    package = list(rel.parts[:-1])
    text = path.read_text(encoding="utf-8") if text is None else text
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
                parts = [*base, *(node.module.split(".") if node.module else [])]
            else:
                parts = (node.module or "").split(".")
            if parts[:1] != ["rkstudy"]:
                continue
            if len(parts) == 1:  # from rkstudy import a, b
                for alias in node.names:
                    yield node.lineno, alias.name
            else:
                yield node.lineno, parts[1]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "rkstudy" and len(parts) > 1:
                    yield node.lineno, parts[1]


def test_the_docstring_places_every_top_level_module():
    order = layers()
    present = {p.name.removesuffix(".py") for p in PACKAGE.iterdir()
               if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()}
    assert sorted(present - set(order)) == [], "modules the layer list does not place"
    assert sorted(set(order) - present) == [], "the layer list names modules that do not exist"


def test_no_import_runs_up_the_layers():
    order = layers()
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent == PACKAGE and path.name == "__init__.py":
            continue
        mine = room(path)
        for line, other in imported_rooms(path):
            if mine in order and other in order and order[other] > order[mine]:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports rkstudy.{other} "
                              f"(layer {order[other]}) from layer {order[mine]} ({mine})")
    assert upward == []


def test_the_scan_sees_a_lazy_upward_import():
    text = "import numpy\n\n\ndef f():\n    from ..families import piper_decoder\n    from .index import Index\n"
    assert list(imported_rooms(PACKAGE / "graph" / "probe.py", text)) == [(5, "families"), (6, "graph")]
