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
  the same keys on every run of the model), "first_audio_s" (from the text's arrival to the first audio a
  player could start: the first chunk, sentence or streamed step, or the whole audio of an offline decode) and
  "first_audio_at" (that moment, epoch seconds), "where", "target",
  "row" (the model's own columns), and optionally "runtime" (the board runtime's versions),
  "npu_predicted" (rkstudy.plan.engines.predicted_on_npu: what the NPU components' calls would take on the
  NPU, by the cost model) and "simulator_peak_rss_mb" (the simulator children, which VmHWM leaves out).

Board side: numpy, soundfile; the job imports what its components need.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..board import gate
from ..board.child import CHILD_TIMEOUT_S, child_main, job_named, run_child, write_child_result
from ..errors import InputError, UsageError
from ..tables import results
from . import audio as audio_files
from .engines import BOARD, ONNX, Engine, choose_runtime, on_board, refuse_off_board
from .schema import ModelPlan, schema
from .validate import Plan, validate

HOST_CHILD_TIMEOUT_S = 4 * 3600.0  # the simulator builds every engine of the plan first
BOARD_WHERE = ("board", "replay")
RAN_BY = {"simulator": "the PC simulator", "onnx": "the engine's graph on this host's CPU (onnxruntime fp32)",
          "rknnlite": "RKNNLite"}


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
    artifacts = [a for choice in plan.choices for names in choice.artifacts.values() for a in names]
    runtime = choose_runtime(runtime, plan.on_npu, artifacts)
    if runtime == BOARD and not on_board():  # the artifacts checked as a host runtime would, then refused
        who.prepare(plan, args, ONNX)
        refuse_off_board(runtime, plan.on_npu)
    return who.prepare(plan, args, runtime), runtime


def payload_of(prepared: Prepared, runtime: str, cores: str, stream: str | None = None) -> dict:
    """What the child's job reads: the speaker's payload, the runtime, the stream target (rkstudy.plan.stream),
    and per component its implementation, params and engines by role."""
    return {**prepared.payload, "runtime": runtime, "cores": cores, "stream": stream,
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
    board = on_board()
    study, table = table_for(schema(model), "board" if board else "fp32")
    root = Path(results_dir) if results_dir else results.results_root(quick=not board)
    return root / study / f"{table}.csv"


def speak(model: str, plan_text, args, *, runtime: str | None = None, cores: str = "0_1_2",
          writable: list[Path] | None = None, started: float | None = None) -> Spoken:
    """Run `model`'s whole synthesis under the plan (`plan_text`: JSON, a file path, or an object) with
    the model's own inputs in `args` (its speaker's add_args); return the row and the audio. `writable`:
    the files the caller will write after (the audio, the table), refused now if this user cannot.
    `started`: when the command started (epoch seconds; the command line passes its process's start), from
    which the row's first_audio_from_start_s counts; by default this call."""
    started = time.time() if started is None else started
    prepared, runtime = prepare(model, plan_text, args, runtime)
    if writable:
        from ..board.run import require_writable

        require_writable([Path(p) for p in writable])
    model_plan = prepared.plan.schema
    for note in prepared.notes:
        print(note, flush=True)
    target = getattr(args, "stream", None)
    payload = payload_of(prepared, runtime, cores, None if target is None else
                         target if str(target) == "-" else str(Path(target).resolve()))
    timeout = CHILD_TIMEOUT_S if runtime == "rknnlite" and prepared.plan.on_npu else HOST_CHILD_TIMEOUT_S
    npu = [(e.path, e.contract) for es in prepared.engines.values() for e in es] if runtime == "rknnlite" else []
    spec = {"job": f"{model_plan.speaker}:job", "payload": payload,
            "gate": gate.for_engines(npu) if npu else {"mode": gate.OFF}}  # the board gate, as `board run`'s
    result, arrays = run_child("rkstudy.plan.speak", spec, label="the synthesis", prefix="rkstudy-speak-",
                               default_timeout=timeout)
    if result["where"] in BOARD_WHERE:  # GateFailed below the gate: nothing written
        prepared.row.update(gate.verdict(result, {p.name: c for p, c in npu}, "no NPU component").row)
    pcm = arrays.pop("audio")
    row = compose(prepared, runtime, result, pcm, started)
    study, table = table_for(model_plan, row["where"])
    return Spoken(row=row, audio=pcm, sample_rate=int(result["sample_rate"]), table=table, study=study)


def compose(prepared: Prepared, runtime: str, result: dict, pcm: np.ndarray, started: float | None = None) -> dict:
    """The run's row: the plan (canonical JSON and digest), the model's columns, audio seconds, wall, RTF,
    load, peak RSS, milliseconds per component (the schema's components first, in pipeline order, then
    the model's other stages), the NPU cost model's prediction beside them, first audio (from the text's
    arrival, loading excluded, and from `started`, the command's start), the engines by digest, and where it
    ran."""
    first = result.get("first_audio_s")
    from_start = (round(result["first_audio_at"] - started, 4)
                  if first is not None and started is not None and result.get("first_audio_at") else "")
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
           "peak_rss_mb": round(result["peak_rss_kb"] / 1024, 1),
           "simulator_peak_rss_mb": result.get("simulator_peak_rss_mb", ""), **timings,
           **predicted_columns(model_plan, plan, runtime, result.get("npu_predicted") or {}, result["where"]),
           "first_audio_s": "" if first is None else round(first, 4), "first_audio_from_start_s": from_start,
           "engines": engines, "sample_rate": result["sample_rate"]}
    if result["where"] in BOARD_WHERE:
        from ..board import sysfs

        row.update({**result["npu_load"], **result["npu_clock"], "cores": result.get("cores", ""),
                    "driver": sysfs.npu_driver_version() or "", "board_runtime": result.get("runtime") or ""})
    return results.stamp({**row, "where": result["where"], "target": result["target"]})


def predicted_columns(model_plan: ModelPlan, plan: Plan, runtime: str, predicted: dict, where: str) -> dict:
    """The NPU cost model's prediction beside the measured times (rkstudy.plan.engines.predicted_on_npu): per
    component that can run on the NPU, what its calls in this run would take there (empty where it ran on the
    CPU or the model cannot speak), their total, the terms in ms and calls, what the numbers are, and the
    same price for the NPU calls made before the first sample left (npu_first_audio_ms_predicted: the NPU's
    share of the time to first audio; the CPU components' share is in this host's first_audio_s). Every row
    of a model has the same columns, whatever its plan."""
    npu_capable = [c.name for c in model_plan.components if c.engines]
    per = {c: predicted.get(c, {}) for c in npu_capable}
    cols = {f"{c}_npu_ms_predicted": round(per[c]["ms"], 1) if per[c].get("ms") is not None else ""
            for c in npu_capable}
    priced = [c for c in plan.on_npu if per.get(c, {}).get("ms") is not None]
    whole = bool(priced) and len(priced) == len(plan.on_npu)
    terms = "; ".join(f"{c}: " + " + ".join(f"{k} {v:.1f}" for k, v in per[c]["terms"].items())
                      + f" ms over {per[c]['calls']} calls" for c in priced)
    first = whole and all(per[c].get("first_ms") is not None for c in priced)
    if not plan.on_npu:
        note = "no NPU component"
    elif where == "board":
        note = "measured on this board's NPU: the <component>_ms columns are the board's own"
    elif runtime == "rknnlite":
        note = ("run through the replay double of RKNNLite: no NPU under it, the <component>_ms columns are this "
                "host's, not a board number")
    elif whole:
        table = ("this run's simulator build" if runtime == "simulator" else
                 "its stage-2 build, recorded in its contract")
        note = (f"a prediction of the NPU cost model (rkstudy.toolkit.cost) from each engine's layer table ({table}), "
                "on its SoC (target), not a board number; the <component>_ms columns are this host's")
    else:
        why = next((per[c]["why"] for c in plan.on_npu if per.get(c, {}).get("why")), "")
        note = f"cannot speak: {why or f'runtime {runtime} reported no prediction'}"
    socs = ",".join(dict.fromkeys(s for c in priced for s in per[c].get("soc", "").split(",") if s))
    return {**cols, "npu_ms_predicted": round(sum(per[c]["ms"] for c in priced), 1) if whole else "",
            "npu_ms_terms": terms, "npu_cost_note": note, "npu_soc": socs if whole else "",
            "npu_first_audio_ms_predicted": round(sum(per[c]["first_ms"] for c in priced), 1) if first else "",
            "npu_first_audio_calls": (" + ".join(f"{c} x{per[c]['first_calls']}" for c in priced)
                                      if first else "")}


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
    first = (f", first audio {r['first_audio_s']} s after the text ({r['first_audio_from_start_s']} s after the "
             "command started)") if r["first_audio_s"] != "" else ""
    if not r["on_npu"]:
        plan = f"plan {r['plan_sha256']} (the CPU path)"
    elif r["where"] == "board":
        plan = f"plan {r['plan_sha256']} ({r['on_npu']} on this board's NPU via {r['runtime']})"
    elif r["where"] == "replay":  # the test double of RKNNLite: the board's code path, no NPU under it
        plan = (f"plan {r['plan_sha256']} ({r['on_npu']} planned for the NPU, run through the replay double of "
                f"{r['runtime']}: no NPU, not a board number)")
    else:
        plan = (f"plan {r['plan_sha256']} ({r['on_npu']} planned for the NPU, run on this host by "
                f"{RAN_BY[r['runtime']]})")
    if r.get("npu_ms_predicted", "") != "":
        parts += (f"; the NPU cost model predicts {r['npu_ms_predicted']} ms for {r['on_npu']} on "
                  f"{r.get('npu_soc') or r['target']} ({r['npu_ms_terms']}; a prediction, not a board "
                  "number)")
        if r.get("npu_first_audio_ms_predicted", "") != "":
            parts += (f", {r['npu_first_audio_ms_predicted']} ms of it before the first audio "
                      f"({r['npu_first_audio_calls']} calls)")
    elif r["on_npu"] and r["where"] not in BOARD_WHERE:
        parts += f"; no NPU prediction ({r['npu_cost_note']})"
    sim = f" (+{r['simulator_peak_rss_mb']} MB in the simulator)" if r.get("simulator_peak_rss_mb", "") != "" else ""
    host = "" if r["where"] in BOARD_WHERE else " (this host's times)"
    return (f"{r['model']} on {r['where']} ({r['target']}), {plan}: {r['audio_s']:.2f} s of audio{host}, RTF "
            f"{r['rtf']:.4f}, wall {r['wall_s']:.3f} s (+{r['load_s']:.2f} s load), peak RSS {r['peak_rss_mb']} MB"
            f"{sim}"
            f"{first}; {parts} -> {table}")


def _child(spec_path: str) -> int:
    """The child: run the model's job, write its audio and its result, with its own peak RSS. A stream the job
    opened (rkstudy.plan.stream) is closed once it has spoken, or abandoned if it failed."""
    from . import stream

    spec = json.loads(Path(spec_path).read_text())
    job = job_named(spec["job"])

    def run() -> dict:
        try:
            out = job(spec["payload"])
        except BaseException:
            stream.finish(ok=False)
            raise
        stream.finish(ok=True)
        return out

    write_child_result(spec, gate.gated_child(spec, run, sample_npu=bool(spec["payload"].get("sample_npu"))))
    return 0


def main(argv=None) -> int:
    """The child's entry (rkstudy.board.child.child_main)."""
    return child_main(argv, _child, "rkstudy speak")


if __name__ == "__main__":
    sys.exit(main())
