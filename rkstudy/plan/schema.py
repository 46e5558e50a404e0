"""What a model's component execution plan may say: its components, each one's implementations, the
artifact roles and the params of its NPU implementation. Each family declares its model's schema
through the registry (`Family.plan`, "module:function() -> ModelPlan"); this module only gathers them.

Board side: standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UsageError

CPU = "onnxruntime"   # this project's CPU path: the model's own graph in onnxruntime
NPU = "rknn"          # an engine compiled by rknn-toolkit2, run by RKNNLite (or a host runtime standing in)
DEFAULT = "default"   # keep the component's existing selection: the CPU path
CPU_BACKEND = "cpu"
# The RKNN decoder-path document's CPU path, named so a plan written for its runtime is answered in
# one line rather than with a bare "unknown"
REFERENCE_CPU = "ggml"


@dataclass(frozen=True)
class Param:
    """One param of an NPU implementation: its JSON type (int or bool), default, and lower bound."""

    name: str
    kind: type
    default: object
    minimum: int | None = None
    says: str = ""

    def describe(self) -> str:
        if self.kind is bool:
            return f"{self.name} (true or false, default {str(self.default).lower()})"
        low = f" >= {self.minimum}" if self.minimum is not None else ""
        return f"{self.name} (integer{low}, default {self.default})"


@dataclass(frozen=True)
class Role:
    """A named artifact of an NPU implementation: required or not, one engine or a ladder of them
    (comma-separated: one engine per width or length)."""

    name: str
    required: bool = False
    ladder: bool = False
    says: str = ""

    def describe(self) -> str:
        return self.name + (" (required)" if self.required else "") + (", a comma-separated ladder" if self.ladder
                                                                       else "")


@dataclass(frozen=True)
class Component:
    """One configurable stage of a model. `engines` is the contract family its NPU engines carry (None:
    the component has only the CPU path); `roles` and `params` belong to the NPU implementation."""

    name: str
    says: str
    engines: str | None = None
    roles: tuple[Role, ...] = ()
    params: tuple[Param, ...] = ()

    @property
    def implementations(self) -> tuple[str, ...]:
        return (CPU, NPU) if self.engines else (CPU,)

    def role(self, name: str) -> Role | None:
        return next((r for r in self.roles if r.name == name), None)

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


@dataclass(frozen=True)
class ModelPlan:
    """A model's plan schema: `model` is the word of `rkstudy speak <model>`, `option` the reference
    document's session option that carries the same JSON, `components` in pipeline order, `study` the
    results folder of host rows. `speaker` names the module that runs the whole synthesis (its
    add_args, prepare and job); None, with `unavailable` saying why, where the model is not here."""

    model: str
    option: str
    title: str
    components: tuple[Component, ...]
    study: str
    speaker: str | None = None
    unavailable: str = ""
    family: str = field(default="", compare=False)  # the registering family (filled in by schemas())

    def component(self, name: str) -> Component | None:
        return next((c for c in self.components if c.name == name), None)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.components]


def schemas() -> dict[str, ModelPlan]:
    """Every model's plan schema, from the families that declare one (registry order). Two families
    declaring one model, or a schema repeating a component, are refused."""
    from dataclasses import replace

    from ..registry import hooked

    out: dict[str, ModelPlan] = {}
    for family, hook in hooked("plan"):
        schema = hook()
        if schema.model in out:
            raise ValueError(f"{family.name} and {out[schema.model].family} both declare the {schema.model} plan")
        names = schema.names
        if len(set(names)) != len(names):
            raise ValueError(f"the {schema.model} plan names a component twice: {names}")
        out[schema.model] = replace(schema, family=family.name)
    return out


def schema(model: str) -> ModelPlan:
    known = schemas()
    if model not in known:
        raise UsageError(f"no plan for {model!r}; models with a component execution plan: {', '.join(known)}")
    return known[model]
