"""Every RKNPU2 target the installed rknn-toolkit2 builds for, measured the same way (host): the
register field on a one-conv probe, and engine size, REGTASK lines and the simulator against fp32
for the stages the families compile (the Piper decoder window and stateful step, a Kokoro window).

A family notebook already builds rk3588 and rk3566 engines of these stages; their rows here come
from the content-keyed build cache (rkstudy.toolkit.build.build_engine) and name the family table that holds
their simulator measurement, so no engine is built twice. The other targets are built once, in a
simulator child, which gives the build row and the simulator SNR together.

The published per-SoC figures of the vendor's VITS demo are held here, labelled as theirs: board
real-time factors, which nothing in this project measures, so they are shown beside the table and
never compared.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from ... import gates
from ...errors import UsageError
from ...tables.results import HOST
from ...targets import RK3562, RK3576, TARGETS, record
from ...toolkit.build import build_engine, check_target
from ...toolkit.log import field_limits
from ...toolkit.simulator import SimulatorRunner

PROBE_CHANNELS = 64
PROBE_LENGTHS = (16384, 131072)  # one past rk3576's 14-bit field, and eight times that

# The vendor's VITS demo (rknn_model_zoo examples/mms_tts, MMS-TTS English encoder + decoder, 200
# tokens): its published board RTF per SoC. Theirs, on their boards; never a number measured here.
PUBLISHED = {RK3576: {"their_figure": "VITS demo RTF (board)", "their_value": 0.069,
                      "their_source": "vendor VITS demo (rknn_model_zoo mms_tts)"},
             RK3562: {"their_figure": "VITS demo RTF (board)", "their_value": 0.138,
                      "their_source": "vendor VITS demo (rknn_model_zoo mms_tts)"}}
THEIRS = "differs: their board RTF of a whole VITS model; nothing here is a board time"


def refusal(target: str) -> str:
    """Why the toolkit builds no fp16 engine for `target` ("" where it does)."""
    try:
        check_target(target)
    except UsageError as exc:
        return str(exc)
    return ""


def field_probe_rows(targets: Sequence[str] = TARGETS, lengths: Sequence[int] = PROBE_LENGTHS) -> list[dict]:
    """The register field per target: a 64-channel k=7 Conv1d at each length built (cached), its
    REGTASK lines, their largest value and the `limit:` the compiler prints; a target the toolkit
    builds no fp16 engine for gets one row carrying the refusal."""
    from ...toolkit.probes import long_axis_probe, save_probe

    rows = []
    for target in targets:
        why = refusal(target)
        if why:
            rows.append({"target": target, "frames": 0, "channels": PROBE_CHANNELS, "status": "refused",
                         "regtask": 0, "regtask_max_value": 0, "limit": "", "field_bits": "", "engine_bytes": 0,
                         "outcome": why, "where": HOST.where})
            continue
        for frames in lengths:
            path = save_probe(long_axis_probe(frames, channels=PROBE_CHANNELS),
                              f"register_field_probe_{PROBE_CHANNELS}x{frames}")
            report = build_engine(path, target).raise_for_status()
            limits = field_limits(Path(report.log).read_text(errors="replace"))
            rows.append({"target": target, "frames": frames, "channels": PROBE_CHANNELS, "status": report.status,
                         "regtask": report.regtask, "regtask_max_value": report.regtask_max,
                         "limit": ", ".join(f"0x{v:x}" for v in limits),
                         "field_bits": ", ".join(str(v.bit_length()) for v in limits),
                         "engine_bytes": report.engine_bytes,
                         "outcome": "built" if not limits else f"{report.regtask} lines past the {limits[0]:#x} field",
                         "where": report.where})
    return rows


def stage_row(stage: str, target: str, build: dict, snr_db: float | None, scored_in: str = "") -> dict:
    """One stage on one target: its build (a BuildReport.row(), or a family's build row: its predicted NPU ms per
    call and the note on it among them) and, where this notebook ran it, the simulator against fp32 (then the row
    is the simulator's); `scored_in` names the table that scored it otherwise, and the row holds the build alone
    (a host row)."""
    return {"stage": stage, "target": target, **{k: build.get(k, "") for k in
                                                ("status", "engine_mb", "regtask", "regtask_max_value", "build_s",
                                                 "npu_ms_predicted", "npu_cost_note")},
            "simulator_vs_fp32_db": round(snr_db, 2) if snr_db is not None else "",
            "scored_in": scored_in or ("this table" if snr_db is not None else ""),
            "where": SimulatorRunner.where if snr_db is not None else HOST.where}


def cached_stage(stage: str, onnx_path: Path, target: str, scored_in: str) -> dict:
    """A stage a family notebook builds for `target`: its engine from the build cache (built here
    only when the family has not run), the simulator measurement left to the family's table."""
    return stage_row(stage, target, build_engine(onnx_path, target).raise_for_status().row(), None, scored_in)


def simulated_stage(stage: str, onnx_path: Path, target: str, out: Path, items: Sequence,
                    run: Callable) -> dict:
    """A stage on a target no family builds: one build in a simulator child, the walk of each item
    through it against the same walk in onnxruntime fp32 (the fp16 cost alone), worst item."""
    from ...toolkit.convert import simulator_vs_fp32

    sim = simulator_vs_fp32(onnx_path, target, items, run=run, out=out,
                            compare=lambda ref, test, item: {"snr_db": gates.snr_db(ref[0], test[0])})
    return stage_row(stage, target, sim.report.row(), sim.worst_snr_db)


def summary_rows(probes: Sequence[dict], stages: Sequence[dict], window_stage: str) -> list[dict]:
    """One row per target: the field the probes measured (or the toolkit's refusal), what the window the plan
    starts from logs there (the REGTASK lines and largest value of `window_stage`'s own build on that target)
    beside the plan's budget (clean: no line, rkstudy.walk.planner.CLEAN), the recorded field width it is
    checked against, and the vendor's published figure beside it where there is one, labelled as theirs."""
    from ...walk.planner import CLEAN, budget_text

    rows = []
    for target in dict.fromkeys(r["target"] for r in probes):
        mine = [r for r in probes if r["target"] == target]
        built = [r for r in mine if r["status"] == "ok"]
        over = [r for r in built if r["regtask"]]
        window = next((r for r in stages if r["target"] == target and r["stage"] == window_stage), None)
        row = {"target": target, "fp16_build": "yes" if built else mine[0]["outcome"],
               "field_limit": next((r["limit"] for r in over), "none printed" if built else ""),
               "field_bits_measured": next((int(r["field_bits"]) for r in over), None) if built else None,
               "field_bits_recorded": record(target).register_field_bits,
               "probe_lines": "; ".join(f"{r['frames']}: {r['regtask']}" for r in built),
               "probe_largest_value": max((r["regtask_max_value"] for r in built), default=0),
               "longest_clean_probe": max((r["frames"] for r in built if not r["regtask"]), default=0),
               "window_lines": window["regtask"] if window else "", "window_value": window["regtask_max_value"]
               if window else "", "window_from": window_stage if window else "",
               "window_clean": window["regtask"] == 0 if window else "", "plan_budget": budget_text(CLEAN, target),
               "their_figure": "", "their_value": "", "their_source": "", "comparable": "",
               "where": HOST.where}
        if record(target) in PUBLISHED:
            row.update(PUBLISHED[record(target)], comparable=THEIRS)
        rows.append(row)
    return rows
