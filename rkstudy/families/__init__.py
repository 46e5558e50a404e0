"""The family registry: one folder per model family, registered once.

A family folder wires the shared pieces and adds only what is its own, in the same section order
everywhere: seam and front end → producer (host) → sidecar (board side) → study (host measurements)
→ cli (its `rkstudy <model> <stage>` command) → board (its `rkstudy board run <family>` job). Its
`__init__.py` registers it, importing nothing heavy, so the command line, `rkstudy doctor` and the
board side can list every family on a board that has no converter.

Adding a family: its folder, and one line in FAMILIES below.

Board side: standard library only.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

# The one registry line per family: the packages under rkstudy/families/ that register themselves.
FAMILIES = ("toolchain", "piper_decoder", "piper_decoder_stateful", "piper_encoder", "inflect_decoder",
            "kokoro_generator", "qwen3_vocoder", "flow_estimator", "port")

# Help for the first word of a family command (`rkstudy piper ...`).
GROUPS = {"piper": "Piper (VITS) voice stages", "inflect": "Inflect v2 decode.onnx contract",
          "kokoro": "Kokoro-82M (iSTFTNet) stages",
          "qwen3": "Qwen3-TTS stages (the 12 Hz vocoder with seeded random weights: the checkpoint is not obtainable)",
          "cosyvoice3": "CosyVoice3 stages (a DiT stand-in with random weights where the model is not obtainable)",
          "port": "your own conv vocoder ONNX: lint, fold, window plan, stateful step, build"}


@dataclass(frozen=True)
class Family:
    """What the command line, doctor, the board side and the results index need to know.

    `cli`, `board`, `planner` and `lint_graphs` are "module:function" strings resolved only when used,
    so registering a family imports nothing but this module.
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

    @property
    def study(self) -> str:
        return self.name

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
    for name in FAMILIES:
        importlib.import_module(f"{__name__}.{name}")
    order = {name: i for i, name in enumerate(FAMILIES)}
    return dict(sorted(REGISTRY.items(), key=lambda item: order.get(item[0], len(order))))


def get(name: str) -> Family:
    families = load_all()
    if name not in families:
        from ..errors import UsageError

        raise UsageError(f"no family {name!r}; families: {', '.join(sorted(families))}")
    return families[name]
