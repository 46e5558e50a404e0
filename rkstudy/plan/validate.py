"""A plan read strictly against its model's schema, then its artifacts found on disk.

The rules (the RKNN decoder-path document's, in this project's words):
* `{}`, an omitted component, an empty object or `"impl": "default"` keep the component's CPU path;
* a component takes four fields only: impl, backend, artifacts, params;
* impl is one of the component's implementations (onnxruntime, the CPU path; rknn, the NPU);
* the CPU path runs on backend "cpu" only; rknn selects the NPU by itself and takes no backend;
* rknn needs every required artifact role, and knows no other role; a role that is not a ladder takes
  one engine; the CPU path takes no artifacts: files alone never select the NPU;
* params belong to the NPU implementation, each of its type and within its bounds (an engine-dependent
  bound, such as Kokoro's overlap against the engine's emitted window, is checked when the engine loads);
* an artifact name that exists in the model's own folder resolves there, else it is a path as given.

Every refusal is one line naming the key and the fix (exit 2, through UsageError).

Board side: standard library only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import UsageError
from .schema import CPU, CPU_BACKEND, DEFAULT, NPU, REFERENCE_CPU, Component, ModelPlan

FIELDS = ("impl", "backend", "artifacts", "params")
EXAMPLE = '{"decoder": {"impl": "rknn", "artifacts": {"main": "decoder.rknn"}}}'


class PlanError(UsageError):
    """A plan that does not fit its model's schema, or names files that are not there (exit 2)."""


@dataclass(frozen=True)
class Choice:
    """One component's selection: its implementation, its artifacts by role (strings as given, then
    resolved paths) and its params (defaults filled in)."""

    component: str
    impl: str = CPU
    artifacts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    params: Mapping[str, object] = field(default_factory=dict)
    paths: Mapping[str, tuple[Path, ...]] = field(default_factory=dict)

    @property
    def npu(self) -> bool:
        return self.impl == NPU

    def path(self, role: str) -> Path | None:
        """The one resolved engine of `role`, or None when the plan does not name it."""
        return self.paths.get(role, (None,))[0]


@dataclass(frozen=True)
class Plan:
    """A validated plan: a choice for every component of the schema, in the schema's order."""

    schema: ModelPlan
    choices: tuple[Choice, ...]

    def __getitem__(self, name: str) -> Choice:
        for c in self.choices:
            if c.component == name:
                return c
        raise KeyError(name)

    @property
    def on_npu(self) -> list[str]:
        return [c.component for c in self.choices if c.npu]

    def canonical(self) -> dict:
        """The plan's meaning as JSON: only components off the CPU path, artifacts by file name,
        every param with its value (defaults included). `{}` and a plan spelling out the CPU path for
        every component are the same plan."""
        out = {}
        for c in self.choices:
            if not c.npu:
                continue
            # a ladder is a set of rungs: listed in any order, it is one plan
            entry = {"impl": c.impl, "artifacts": {r: ",".join(sorted(Path(v).name for v in vs))
                                                   for r, vs in sorted(c.artifacts.items())}}
            if c.params:
                entry["params"] = dict(sorted(c.params.items()))
            out[c.component] = entry
        return out

    def canonical_json(self) -> str:
        return json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))

    @property
    def digest(self) -> str:
        """sha256 of the canonical JSON, 16 hex digits: one plan, one digest, on every machine."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:16]


def _refuse(schema: ModelPlan, text: str) -> PlanError:
    return PlanError(f"{schema.model} plan: {text}")


def _no_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise PlanError(f"--plan gives {key!r} twice; give each key once")
        seen[key] = value
    return seen


def read(text: str | Mapping) -> dict:
    """The plan's JSON from `--plan`: a JSON object, or the path of a file holding one."""
    if isinstance(text, Mapping):
        return dict(text)
    source = "--plan"
    stripped = text.strip()
    if not stripped.startswith(("{", "[", '"')) and stripped not in ("null", "true", "false"):
        path = Path(stripped)
        if not path.is_file():
            raise PlanError(f"--plan {text!r} is neither JSON nor a file; pass a JSON object such as '{EXAMPLE}' or "
                            "the path of a file holding one")
        try:
            stripped = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise PlanError(f"--plan {path} is not UTF-8 text; give a file holding a JSON object") from None
        source = f"--plan {path}"
    try:
        value = json.loads(stripped, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise PlanError(f"{source} is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); pass a JSON "
                        f"object such as '{EXAMPLE}'") from None
    if not isinstance(value, dict):
        raise PlanError(f"{source} is a JSON {type(value).__name__}, not an object; pass {{}} for the CPU path or "
                        f"an object of components such as '{EXAMPLE}'")
    return value


def _ladder(schema: ModelPlan, comp: Component, role: str, value) -> tuple[str, ...]:
    key = f"{comp.name}.artifacts.{role}"
    if not isinstance(value, str) or not value.strip():
        raise _refuse(schema, f"{key} is {json.dumps(value)}; give the engine's file name or path as a string")
    parts = tuple(p.strip() for p in value.split(","))
    if any(not p for p in parts):
        raise _refuse(schema, f"{key} {value!r} has an empty entry; list the engines as \"a.rknn,b.rknn\"")
    spec = comp.role(role)
    if len(parts) > 1 and not spec.ladder:
        raise _refuse(schema, f"{key} lists {len(parts)} engines, and {role} takes one (a comma-separated ladder is "
                              f"{_ladders(schema)}); name one engine")
    if len(set(parts)) != len(parts):
        raise _refuse(schema, f"{key} names an engine twice; list each rung once")
    return parts


def _ladders(schema: ModelPlan) -> str:
    found = [f"{c.name}.{r.name}" for c in schema.components for r in c.roles if r.ladder]
    return "taken by " + " and ".join(found) if found else "taken by no role of this model"


def _impl(schema: ModelPlan, comp: Component, given: dict) -> str:
    impl = given.get("impl", DEFAULT)
    if impl == DEFAULT:
        return CPU
    if impl in comp.implementations:
        return impl
    key = f"{comp.name}.impl"
    if not isinstance(impl, str):
        raise _refuse(schema, f"{key} is {json.dumps(impl)}; give \"rknn\", \"{CPU}\" or \"{DEFAULT}\" as a string")
    if impl == NPU:
        raise _refuse(schema, f"{key} \"rknn\": {comp.name} has no NPU implementation here; omit impl (the CPU path)")
    also = (f" ({REFERENCE_CPU} is the RKNN decoder-path document's CPU path; here the CPU path is {CPU})"
            if impl == REFERENCE_CPU else "")
    choices = ", ".join(f'"{i}"' for i in (*comp.implementations, DEFAULT))
    raise _refuse(schema, f"{key} {json.dumps(impl)} is not an implementation of {comp.name}; use one of "
                          f"{choices}{also}")


def _component(schema: ModelPlan, comp: Component, given) -> Choice:
    if not isinstance(given, dict):
        raise _refuse(schema, f"{comp.name} is {json.dumps(given)}, not an object; give {{}} for the CPU path or "
                              f"{{\"impl\": \"rknn\", \"artifacts\": {{...}}}}")
    unknown = [k for k in given if k not in FIELDS]
    if unknown:
        raise _refuse(schema, f"{comp.name} has unknown field {unknown[0]!r}; a component takes "
                              f"{', '.join(FIELDS)}")
    impl = _impl(schema, comp, given)
    backend = given.get("backend")
    if backend is not None:
        if impl == NPU:
            raise _refuse(schema, f"{comp.name}.backend {json.dumps(backend)} with impl \"rknn\": rknn selects the NPU "
                                  "by itself; omit backend")
        if backend != CPU_BACKEND:
            raise _refuse(schema, f"{comp.name}.backend {json.dumps(backend)}: the {CPU} path runs on "
                                  f"\"{CPU_BACKEND}\" only; omit backend or give \"{CPU_BACKEND}\"")
    artifacts = given.get("artifacts", {})
    if not isinstance(artifacts, dict):
        raise _refuse(schema, f"{comp.name}.artifacts is {json.dumps(artifacts)}, not an object of roles; give "
                              "{\"main\": \"engine.rknn\"}")
    params = given.get("params", {})
    if not isinstance(params, dict):
        raise _refuse(schema, f"{comp.name}.params is {json.dumps(params)}, not an object; give "
                              "{\"name\": value, ...}")
    if impl != NPU:
        if artifacts:
            raise _refuse(schema, f"{comp.name}.artifacts names {', '.join(artifacts)} without \"impl\": \"rknn\": "
                                  "files alone never select the NPU; add \"impl\": \"rknn\" or drop the artifacts")
        if params:
            raise _refuse(schema, f"{comp.name}.params {', '.join(params)}: the {CPU} path takes no params; omit "
                                  "them")
        return Choice(component=comp.name)
    roles = {}
    for role, value in artifacts.items():
        if comp.role(role) is None:
            known = ", ".join(r.describe() for r in comp.roles)
            raise _refuse(schema, f"{comp.name}.artifacts has unknown role {role!r}; {comp.name}'s roles are {known}")
        roles[role] = _ladder(schema, comp, role, value)
    missing = [r.name for r in comp.roles if r.required and r.name not in roles]
    if missing:
        raise _refuse(schema, f"{comp.name}.artifacts.{missing[0]} is missing: impl \"rknn\" needs the engine, such as "
                              f"\"artifacts\": {{\"{missing[0]}\": \"{comp.name}.rknn\"}}")
    values = {p.name: p.default for p in comp.params}
    for name, value in params.items():
        p = comp.param(name)
        if p is None:
            takes = ", ".join(q.describe() for q in comp.params) or "no params"
            raise _refuse(schema, f"{comp.name}.params {name!r} is unsupported; {comp.name} (rknn) takes {takes}")
        key = f"{comp.name}.params.{name}"
        if p.kind is bool:
            if not isinstance(value, bool):
                raise _refuse(schema, f"{key} is {json.dumps(value)}; give true or false")
        elif not isinstance(value, int) or isinstance(value, bool):
            raise _refuse(schema, f"{key} is {json.dumps(value)}; give an integer")
        elif p.minimum is not None and value < p.minimum:
            raise _refuse(schema, f"{key} is {value}; give an integer >= {p.minimum}")
        values[name] = value
    return Choice(component=comp.name, impl=NPU, artifacts=roles, params=values)


def validate(schema: ModelPlan, given: str | Mapping) -> Plan:
    """`given` (JSON text, a file path, or the parsed object) checked against `schema`."""
    value = read(given)
    unknown = [k for k in value if schema.component(k) is None]
    if unknown:
        raise _refuse(schema, f"{unknown[0]!r} is not a {schema.model} component; {schema.model}'s components are "
                              f"{', '.join(schema.names)}")
    return Plan(schema=schema, choices=tuple(_component(schema, c, value.get(c.name, {})) for c in schema.components))


def resolve(plan: Plan, model_dir: Path | str | None) -> Plan:
    """Every artifact found on disk: a name that exists in `model_dir` (the model's own folder) resolves
    there, anything else is a path as given (relative to the working directory). A file found in
    neither place is refused, naming both."""
    folder = Path(model_dir) if model_dir else None
    choices = []
    for c in plan.choices:
        paths = {}
        for role, values in c.artifacts.items():
            found = []
            for v in values:
                inside = folder / v if folder is not None else None
                if inside is not None and inside.is_file():
                    found.append(inside)
                elif Path(v).is_file():
                    found.append(Path(v))
                else:
                    where = f" (not in {folder}, the model's folder, either)" if folder is not None else ""
                    raise _refuse(plan.schema, f"{c.component}.artifacts.{role}: no file {v!r}{where}; give the "
                                               "engine's path, or put it in the model's folder")
            paths[role] = tuple(found)
        choices.append(replace(c, paths=paths))
    return replace(plan, choices=tuple(choices))
