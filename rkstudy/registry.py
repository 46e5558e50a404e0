"""The family registry: what every layer may know about the model families without importing one.

Families are plugins: each package under rkstudy/families/ registers a `Family` record here when it is
imported, and `load_all` imports them by name (rkstudy.families.FAMILIES), the way entry points load
plugins. A shared layer (the results index, lint, the toolkit-lever studies) asks this registry for a
family's hooks ("module:function" strings resolved only when called); it never imports a family module.

Board side: standard library only.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

PACKAGE = "rkstudy.families"


@dataclass(frozen=True)
class Family:
    """What the command line, doctor, the board side and the results index need to know.

    `cli`, `board`, `planner`, `lint_graphs`, `lever_graphs`, `npu_cost_cases`, `compiler_cases`, `plan` and
    `bundle` are "module:function" strings resolved only when used, so registering a family imports nothing but
    this module.
    """

    name: str                              # the registry key, the contract's family, the study
    title: str                             # one line, for help texts and the results index
    notebook: str | None = None            # notebooks/<file> that runs the study
    command: tuple[str, ...] | None = None  # `rkstudy <command...>`, e.g. ("piper", "decoder")
    cli: str | None = None                 # "module:function(subparsers)" adding the stage command
    board: str | None = None               # "module:function(subparsers)" adding `board run <name>`
    requires: tuple[str, ...] = ()         # modules its host side needs beyond the converter (doctor checks)
    planner: str | None = None             # "module:function() -> rkstudy.walk.planner.PlanTarget" (walked decoders)
    lint_graphs: str | None = None         # "module:function(quick) -> [rkstudy.lint.study.FamilyGraph]" (notebook 06)
    lever_graphs: str | None = None        # "module:function(quick) -> rkstudy.levers.LeverGraphs" (notebook 08)
    # "module:function(quick) -> rkstudy.levers.npu_cost.Cases": the engines the reference documents ran on
    # a board and the board figures they predict (notebook 09)
    npu_cost_cases: str | None = None
    compiler_cases: str | None = None      # "module:function() -> [rkstudy.lint.against_toolkit.Case]" (notebook 06)
    # stage 2 where it is not the stage-1 command with --onnx: "rkstudy port build --onnx {graph} --inputs ..."
    # ({graph} is the produced graph; a refusal's fix adds --target)
    stage2: str | None = None
    # the one command that makes an engine of this family from what the package ships (stage 1 and stage 2
    # together, {target} for the SoC): the fix a refusal names when no contract is at hand to name a producer
    makes: str | None = None
    plan: str | None = None                # "module:function() -> rkstudy.plan.ModelPlan" (`rkstudy speak`)
    bundle: str | None = None              # "module:function() -> rkstudy.cliutil.BundlePart" (`rkstudy bundle`)
    # a stage that is a flag of another family's command: the module whose handlers that command calls
    # (`rkstudy piper decoder --stateful`), found through this record, never imported by name
    handlers: str | None = None
    # the families this one is cut from or measured beside, whose modules its own may import (the Inflect
    # decode.onnx is carved by the Piper decoder's producer); every other family is reached through this
    # registry (tests/test_families.py reads the imports)
    builds_on: tuple[str, ...] = ()

    def handler(self, name: str):
        """`name` from the module `handlers` names."""
        if not self.handlers:
            raise LookupError(f"the {self.name} family registers no handlers")
        return getattr(importlib.import_module(self.handlers), name)

    def resolve(self, which: str):
        module, _, attr = getattr(self, which).partition(":")
        return getattr(importlib.import_module(module), attr)


REGISTRY: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add `family`; a second family under the same name or command is refused."""
    if family.name in REGISTRY and REGISTRY[family.name] != family:
        raise ValueError(f"two families are registered as {family.name!r}")
    clash = [f.name for f in REGISTRY.values() if family.command and f.command == family.command
             and f.name != family.name]
    if clash:
        raise ValueError(f"{family.name} and {clash[0]} both claim `rkstudy {' '.join(family.command)}`")
    REGISTRY[family.name] = family
    return family


def load_all() -> dict[str, Family]:
    """Import every family package (each registers itself) and return the registry in FAMILIES order
    (not import order, which depends on what was imported first: the CLI and the index stay stable)."""
    names = importlib.import_module(PACKAGE).FAMILIES
    for name in names:
        importlib.import_module(f"{PACKAGE}.{name}")
    order = {name: i for i, name in enumerate(names)}
    return dict(sorted(REGISTRY.items(), key=lambda item: order.get(item[0], len(order))))


def get(name: str) -> Family:
    families = load_all()
    if name not in families:
        from ..errors import UsageError

        raise UsageError(f"no family {name!r}; families: {', '.join(sorted(families))}")
    return families[name]


def hooked(which: str) -> Iterator[tuple[Family, Callable]]:
    """(family, its resolved `which` hook) for every family that declares one, in FAMILIES order."""
    for family in load_all().values():
        if getattr(family, which):
            yield family, family.resolve(which)
