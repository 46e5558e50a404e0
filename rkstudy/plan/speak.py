"""`rkstudy speak MODEL`: a whole text (or a model's whole input) spoken under a component execution plan,
each component on its plan's implementation, measured in a dedicated child process.

The parent reads the plan strictly (rkstudy.plan.validate), picks the runtime of its NPU components
(rkstudy.plan.engines), and lets the model's speaker prepare the run: its inputs read, the plan's
artifacts found in the model's folder, every engine checked against its contract. Anything wrong ends
there in one line, exit 2, before anything is written. A child (rkstudy.board.child, the launcher
`rkstudy board run` uses too: Ctrl-C, SIGHUP and SIGTERM stop it with the parent) then runs the model's
job: it loads every component, speaks, and reports its own peak RSS (VmHWM: the whole synthesis,
comparable between plans, not the notebook kernel's), the time per component and, on a board, the
per-core NPU load while it ran. The parent writes the audio and one row.

A model's speaker is a module (ModelPlan.speaker) with:
* add_args(parser): the model's own inputs (text, voice, codes, ...);
* prepare(plan, args, runtime) -> Prepared: the payload of the child, the row's known columns, the engines;
* job(payload) -> dict, in the child: "audio", "sample_rate", "wall_s" (the synthesis, text to last
  sample), "load_s" (sessions and engines opened before it), "ms" ({component or stage: milliseconds},
  the same keys on every run of the model), "first_audio_s" (streaming, else None), "where", "target",
  "row" (the model's own columns), and optionally "runtime" (the board runtime's versions).

Board side: numpy, soundfile; the job imports what its components need.
"""

from __future__ import annotations

import importlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..board import gate
from ..board.child import CHILD_TIMEOUT_S, child_main, job_named, run_child, write_child_result
from ..errors import InputError, UsageError
from ..tables import results
from . import audio as audio_files
from .engines import Engine, choose_runtime
from .schema import ModelPlan, schema
from .validate import Plan, validate

HOST_CHILD_TIMEOUT_S = 4 * 3600.0  # the simulator builds every engine of the plan first
BOARD_WHERE = ("board", "replay")


@dataclass
class Prepared:
    """What a model's speaker hands the child, and the row's columns it knows before the run."""

    plan: Plan
    payload: dict
    row: dict = field(default_factory=dict)
    engines: dict[str, list[Engine]] = field(default_factory=dict)   # "component.role" -> engines
    notes: list[str] = field(default_factory=list)                    # said once before the run


@dataclass
class Spoken:
    """A finished run: its row (stamped), its audio and the rate, the table it belongs to."""

    row: dict
    audio: np.ndarray
    sample_rate: int
    table: str
    study: str


def speaker(model_plan: ModelPlan):
    """The speaker module of a model, or a usage error saying why there is none here."""
    if model_plan.speaker is None:
        raise UsageError(f"the plan is valid; {model_plan.unavailable}")
    return importlib.import_module(model_plan.speaker)


def prepare(model: str, plan_text, args, runtime: str | None) -> tuple[Prepared, str]:
    """Everything the parent checks before a child starts; (prepared, runtime)."""
    model_plan = schema(model)
    plan = validate(model_plan, plan_text)
    who = speaker(model_plan)
    runtime = choose_runtime(runtime, plan.on_npu)
    return who.prepare(plan, args, runtime), runtime


def payload_of(prepared: Prepared, runtime: str, cores: str) -> dict:
    """What the child's job reads: the speaker's payload, the runtime, and per component its
    implementation, params and engines by role."""
    from .engines import BOARD, on_board

    return {**prepared.payload, "runtime": runtime, "cores": cores,
            "sample_npu": runtime == BOARD and bool(prepared.plan.on_npu) and on_board(),
            "plan": {c.component: {"impl": c.impl, "params": dict(c.params),
                                   "engines": {role: [e.to_json() for e in prepared.engines.get(
                                       f"{c.component}.{role}", [])] for role in c.paths}}
                     for c in prepared.plan.choices}}


def table_for(model_plan: ModelPlan, where: str) -> tuple[str, str]:
    """(study folder, table) of a row: board and replay rows go under results/board/ (only board runs
    write there), host rows under the model's study."""
    if where in BOARD_WHERE:
        return "board", f"speak_{model_plan.model}"
    return model_plan.study, "speak"


def destination(model: str, results_dir: Path | None = None) -> Path:
    """The table a run here appends to (see record): known before the run, since a board's runs (the CPU
    plan's too) are board or replay rows and a host's never are."""
    from .engines import on_board

    board = on_board()
    study, table = table_for(schema(model), "board" if board else "fp32")
    root = Path(results_dir) if results_dir else results.results_root(quick=not board)
    return root / study / f"{table}.csv"


def speak(model: str, plan_text, args, *, runtime: str | None = None, cores: str = "0_1_2",
          writable: list[Path] | None = None) -> Spoken:
    """Run `model`'s whole synthesis under the plan (`plan_text`: JSON, a file path, or an object) with
    the model's own inputs in `args` (its speaker's add_args); return the row and the audio. `writable`:
    the files the caller will write after (the audio, the table), refused now if this user cannot."""
    prepared, runtime = prepare(model, plan_text, args, runtime)
    if writable:
        from ..board.run import require_writable

        require_writable([Path(p) for p in writable])
    model_plan = prepared.plan.schema
    for note in prepared.notes:
        print(note, flush=True)
    payload = payload_of(prepared, runtime, cores)
    timeout = CHILD_TIMEOUT_S if runtime == "rknnlite" and prepared.plan.on_npu else HOST_CHILD_TIMEOUT_S
    npu = [(e.path, e.contract) for es in prepared.engines.values() for e in es] if runtime == "rknnlite" else []
    spec = {"job": f"{model_plan.speaker}:job", "payload": payload,
            "gate": gate.for_engines(npu) if npu else {"mode": gate.OFF}}  # the board gate, as `board run`'s
    result, arrays = run_child("rkstudy.plan.speak", spec, label="the synthesis", prefix="rkstudy-speak-",
                               default_timeout=timeout)
    if result["where"] in BOARD_WHERE:  # GateFailed below the gate: nothing written
        prepared.row.update(gate.verdict(result, {p.name: c for p, c in npu}, "no NPU component").row)
    pcm = arrays.pop("audio")
    row = compose(prepared, runtime, result, pcm)
    study, table = table_for(model_plan, row["where"])
    return Spoken(row=row, audio=pcm, sample_rate=int(result["sample_rate"]), table=table, study=study)


def compose(prepared: Prepared, runtime: str, result: dict, pcm: np.ndarray) -> dict:
    """The run's row: the plan (canonical JSON and digest), the model's columns, audio seconds, wall, RTF,
    load, peak RSS, milliseconds per component (the schema's components first, in pipeline order, then
    the model's other stages), first audio, the engines by digest, and where it ran."""
    plan, model_plan = prepared.plan, prepared.plan.schema
    audio_s = pcm.size / result["sample_rate"] if result["sample_rate"] else 0.0
    ms = dict(result["ms"])
    timings = {f"{c}_ms": round(ms.pop(c, 0.0), 3) for c in model_plan.names}
    timings.update({f"{k}_ms": round(v, 3) for k, v in ms.items()})
    engines = "; ".join(f"{key}={','.join(e.label for e in es)}" for key, es in prepared.engines.items())
    row = {"model": model_plan.model, "plan": plan.canonical_json(), "plan_sha256": plan.digest,
           "on_npu": ",".join(plan.on_npu), "runtime": runtime if plan.on_npu else "", **prepared.row,
           **result.get("row", {}), "audio_s": round(audio_s, 3), "wall_s": round(result["wall_s"], 4),
           "rtf": result["wall_s"] / audio_s if audio_s else float("nan"), "load_s": round(result["load_s"], 3),
           "peak_rss_mb": round(result["peak_rss_kb"] / 1024, 1), **timings,
           "first_audio_s": "" if result.get("first_audio_s") is None else round(result["first_audio_s"], 4),
           "engines": engines, "sample_rate": result["sample_rate"]}
    if result["where"] in BOARD_WHERE:
        from ..board import sysfs

        row.update({**result["npu_load"], **result["npu_clock"], "cores": result.get("cores", ""),
                    "driver": sysfs.npu_driver_version() or "", "board_runtime": result.get("runtime") or ""})
    return results.stamp({**row, "where": result["where"], "target": result["target"]})


def record(spoken: Spoken, *, audio: Path | None = None, results_dir: Path | None = None) -> Path:
    """Write the audio (WAV or FLAC) and append the row to its table: `<results>/board/speak_<model>.csv`
    for a board or replay run (default results/), `<results>/<study>/speak.csv` for a host run (default
    build/quick-results/: a host run from the command line never edits the committed tables, which the
    notebooks write). Under sudo, what it wrote and the folders it made go back to the invoking user.
    Returns the table."""
    from ..board.run import hand_back

    board = spoken.row["where"] in BOARD_WHERE
    root = Path(results_dir) if results_dir else results.results_root(quick=not board)
    path = root / spoken.study / f"{spoken.table}.csv"
    created, folder = [], path.parent
    while not folder.exists():
        created.append(folder)
        folder = folder.parent
    if audio is not None and spoken.audio.size:
        audio_files.write(audio, spoken.audio, spoken.sample_rate)
        print(f"wrote {audio} ({spoken.audio.size / spoken.sample_rate:.2f} s at {spoken.sample_rate} Hz)")
    rows = results.read_table(path) if path.is_file() else []
    if rows and list(rows[0]) != list(spoken.row):
        raise InputError(f"{path} has other columns than this run's row; pass --results DIR for a fresh table")
    written = results.write_table(spoken.study, spoken.table, rows + [spoken.row], root=root,
                                  title=f"Whole syntheses under a component execution plan: {spoken.row['model']}")
    hand_back([path, path.with_suffix(".md")] + ([Path(audio)] if audio else []), created)
    return written


def summary_line(spoken: Spoken, table: Path) -> str:
    r = spoken.row
    parts = ", ".join(f"{k[:-3]} {float(v):.0f} ms" for k, v in r.items() if k.endswith("_ms"))
    first = f", first audio {r['first_audio_s']} s" if r["first_audio_s"] != "" else ""
    plan = f"plan {r['plan_sha256']} ({r['on_npu']} on the NPU via {r['runtime']})" if r["on_npu"] else \
        f"plan {r['plan_sha256']} (the CPU path)"
    return (f"{r['model']} on {r['where']} ({r['target']}), {plan}: {r['audio_s']:.2f} s of audio, RTF "
            f"{r['rtf']:.4f}, wall {r['wall_s']:.3f} s (+{r['load_s']:.2f} s load), peak RSS {r['peak_rss_mb']} MB"
            f"{first}; {parts} -> {table}")


def _child(spec_path: str) -> int:
    """The child: run the model's job, write its audio and its result, with its own peak RSS."""
    spec = json.loads(Path(spec_path).read_text())
    job = job_named(spec["job"])
    write_child_result(spec, gate.gated_child(spec, lambda: job(spec["payload"]),
                                              sample_npu=bool(spec["payload"].get("sample_npu"))))
    return 0


def main(argv=None) -> int:
    """The child's entry (rkstudy.board.child.child_main)."""
    return child_main(argv, _child, "rkstudy speak")


if __name__ == "__main__":
    sys.exit(main())
