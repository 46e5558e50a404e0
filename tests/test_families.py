"""The family registry against the family template (rkstudy/families/README.md): every family folder
has the template's modules, its __init__ docstring lists them in the template's order, every module
in the folder is listed, and each hook names a module of its own folder. A family that legitimately
lacks a module is named below with the reason."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from rkstudy import families

FOLDER = Path(families.__file__).parent
TEMPLATE = FOLDER / "README.md"

# family -> {module it lacks: why}
LACKS = {
    "toolchain": {m: "it measures the tools on probe graphs: no stage to produce, no board job, no model to speak"
                  for m in ("producer.py", "sidecar.py", "cli.py", "board.py", "speak.py")},
    "piper_decoder_stateful": {"speak.py": "the Piper plan (piper_decoder's) names the window engine's decoder"},
    "piper_encoder": {"speak.py": "its engines are the Piper plan's duration_encoder; piper_decoder declares it"},
    "inflect_decoder": {"producer.py": "carve.py cuts the decode.onnx and the Piper decoder's producer makes its slice",
                        "sidecar.py": "its engines run through the Piper decoder's sidecar",
                        "board.py": "its engines run through the Piper decoder's board job"},
    "flow_estimator": {"sidecar.py": "its board side is the shared memory kit (rkstudy.board.memory)",
                       "board.py": "its board commands are `rkstudy board memory | check | dram`"},
    "port": {"lint_graphs.py": "its graphs are the user's own: `rkstudy port lint` lints them",
             "speak.py": "a user's own vocoder has no model around it to speak with"},
}
# family -> hook the module exists for but the registry leaves unset: why
NO_HOOK = {("piper_decoder_stateful", "cli"): "its flags live in piper_decoder's command; cli.py holds the handlers"}


def template_modules() -> list[str]:
    """The template's modules in order: the rows of its table numbered 1 and up."""
    rows = re.findall(r"^\| (\d+) \| `(\w+\.py)` \|", TEMPLATE.read_text(encoding="utf-8"), flags=re.M)
    assert [int(n) for n, _ in rows] == list(range(1, len(rows) + 1)), rows
    return [m for _, m in rows]


def test_the_template_lists_the_modules_every_family_is_built_from():
    assert template_modules() == ["producer.py", "sidecar.py", "study.py", "lint_graphs.py", "cli.py", "board.py",
                                  "speak.py"]


@pytest.mark.parametrize("name", families.FAMILIES)
def test_family_folder_follows_the_template(name):
    registered = families.load_all()[name]
    folder = FOLDER / name
    files = sorted(p.name for p in folder.glob("*.py") if p.name != "__init__.py")
    core = template_modules()
    lacks = LACKS.get(name, {})
    assert [m for m in core if m not in files] == [m for m in core if m in lacks], \
        f"{name}: lacks {sorted(set(core) - set(files))}, the exceptions name {sorted(lacks)}"

    doc = importlib.import_module(f"rkstudy.families.{name}").__doc__
    listed = list(dict.fromkeys(re.findall(r"\b(\w+\.py)\b", doc)))
    assert sorted(listed) == files, f"{name}: its __init__ lists {listed}, the folder has {files}"
    in_order = [m for m in listed if m in core]
    assert in_order == [m for m in core if m in files], f"{name}: listed in the order {in_order}"

    for hook, module in (("cli", "cli.py"), ("board", "board.py"), ("lint_graphs", "lint_graphs.py"),
                         ("lever_graphs", "levers.py"), ("plan", "speak.py")):
        value = getattr(registered, hook)
        if (name, hook) in NO_HOOK:
            assert value is None and module in files
            continue
        assert (value is not None) == (module in files), f"{name}: {hook}={value!r} with {module} present: " \
                                                         f"{module in files}"
        if value:
            assert value.startswith(f"rkstudy.families.{name}.{module[:-3]}:"), value


def test_compiler_cases_come_from_the_family_levers_module():
    for name, family in families.load_all().items():
        if family.compiler_cases:
            assert family.compiler_cases.startswith(f"rkstudy.families.{name}.levers:"), family.compiler_cases


def test_every_plan_schema_comes_from_the_registry():
    """Each model's plan is one family's `plan` hook; the models are the reference document's five."""
    from rkstudy.plan import schemas

    found = schemas()
    assert sorted(found) == ["cosyvoice3", "inflect", "kokoro", "piper", "qwen3"]
    for model, schema in found.items():
        family = families.load_all()[schema.family]
        assert family.plan == f"rkstudy.families.{family.name}.speak:plan", family.plan
        assert schema.speaker in (None, f"rkstudy.families.{family.name}.speak")
        assert bool(schema.speaker) != bool(schema.unavailable), model


def test_every_family_folder_is_registered():
    folders = sorted(p.parent.name for p in FOLDER.glob("*/__init__.py") if p.parent.name != "__pycache__")
    shared = {"piper"}  # the Piper voice the Piper families share: not a family of its own
    assert sorted(set(folders) - shared) == sorted(families.FAMILIES)
    assert set(LACKS) | {f for f, _ in NO_HOOK} <= set(families.FAMILIES)


def _family_imports(name: str) -> set[str]:
    """The other families a family's modules import (the shared Piper voice package is no family)."""
    import ast

    found = set()
    for path in (FOLDER / name).glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level == 2 and node.module:          # from ..<family>... import
                    found.add(node.module.split(".")[0])
                elif node.level == 2:                         # from .. import <family>
                    found.update(a.name for a in node.names)
                elif node.level == 0 and (node.module or "").startswith("rkstudy.families."):
                    found.add(node.module.split(".")[2])
    return (found & set(families.FAMILIES)) - {name}


@pytest.mark.parametrize("name", families.FAMILIES)
def test_a_family_imports_only_the_families_its_record_says_it_builds_on(name):
    """Any other family is reached through the registry (a hook, or `handlers`), so a new cross-family
    import shows up here until the record declares it."""
    declared = set(families.load_all()[name].builds_on)
    assert _family_imports(name) <= declared, f"{name} imports {sorted(_family_imports(name) - declared)}"
    assert declared <= set(families.FAMILIES) - {name}


def test_what_families_build_on_has_no_cycle():
    graph = {name: set(f.builds_on) for name, f in families.load_all().items()}
    done: set[str] = set()

    def visit(name, path):
        assert name not in path, f"builds_on cycle: {' -> '.join([*path, name])}"
        if name not in done:
            for other in graph[name]:
                visit(other, [*path, name])
            done.add(name)

    for name in graph:
        visit(name, [])


@pytest.mark.parametrize("name", [n for n in families.FAMILIES if n != "toolchain"])
def test_a_refusal_without_a_contract_names_a_command_the_cli_takes(name):
    """help_for is the fix of a refusal that has no contract to ask (no engine, an empty file, another
    family's engine): it must be a whole command this CLI parses, for the SoC asked, that builds an engine
    (stage 1 and 2 together, or a user graph's stage 2), never a pointer at --help."""
    import shlex

    from rkstudy.cli import parser
    from rkstudy.contract import help_for

    command = help_for(name, "rk3576")
    words = shlex.split(command.replace("<", "").replace(">", ""))
    assert words[0] == "rkstudy" and "--help" not in words and "--skip-rknn" not in words, command
    args = parser().parse_args(words[1:])
    assert args.target == ["rk3576"] and callable(args.func), command
