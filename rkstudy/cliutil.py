"""Command-line pieces every family command shares (board side: argparse only).

Exit codes and messages follow rkstudy.errors: one line on stderr naming the fix; 2 for bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import Failed, InputError, UsageError
from .targets import ALL_TARGETS, TARGETS


@dataclass(frozen=True)
class BundlePart:
    """What one model puts in the board bundle (`rkstudy bundle`, rkstudy.bundle), declared by its family
    (Family.bundle): `host` are the rkstudy commands that make its engines for every SoC (each with its contract
    and the fp32 graph beside it) and the inputs its board runs read, run in order inside the bundle's folder;
    `board` the commands of the bundle's walk-through (after `.venv-board/bin/rkstudy`), whose `board run`s the
    bundle gates with a reference made on the host where the fp32 pass is too slow for a board; `plan` its
    component execution plan, in which "{engine:FAMILY}" names that family's engine for the plan's SoC (one plan
    per SoC is written); `files` what is copied in ((a path on the host, its path in the bundle): the voice a plan
    speaks with); `says` one line for the bundle's README. `board_cpu` (one part has it) measures how many times
    slower a board's CPU runs onnxruntime than this host: a callable returning (factor, how it was measured)."""

    model: str
    says: str
    host: tuple[tuple[str, ...], ...]
    board: tuple[tuple[str, ...], ...]
    plan: dict | None = None
    files: tuple[tuple[str, str], ...] = ()
    board_cpu: object = None


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage block) and exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def positive(text: str) -> int:
    """An argparse type: an integer >= 1 (a width of 0 or -3 is refused by the parser)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def targets(text: str) -> list[str]:
    """An argparse type: one target, a comma-separated list (`rk3588,rk3576`), or `all` (ALL_TARGETS: one
    engine for every board `rkstudy board run` serves, one per NPU)."""
    if text.strip() == "all":
        return list(ALL_TARGETS)
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in names if t not in TARGETS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown) or repr(text)} is not a target; give one or more of "
                                         f"{', '.join(TARGETS)} (comma-separated), or all ({','.join(ALL_TARGETS)})")
    return list(dict.fromkeys(names))


def add_target_arg(p: argparse.ArgumentParser) -> None:
    """`--target` of every stage-2 command: one SoC, a list, or all of them, one engine and contract each."""
    p.add_argument("--target", type=targets, default=["rk3588"], metavar="T[,T...]|all",
                   help=f"the SoC(s) to build for: one of {', '.join(TARGETS)}, a comma-separated list, or all "
                        f"({','.join(ALL_TARGETS)}: one engine per NPU a board run serves); default rk3588")


def add_stage_args(p: argparse.ArgumentParser, *, output_help: str = "where stage 1 writes the graph") -> None:
    """The two-stage flags every producer takes: stage 1 writes a graph (--skip-rknn --output X),
    stage 2 converts one (--onnx X --target T[,T...]|all [--out E|FOLDER] [--toolkit V])."""
    p.add_argument("--onnx", type=Path, help="stage 2: a produced graph; its contract is read from it")
    p.add_argument("--output", type=Path, help=output_help + " (always rewritten)")
    p.add_argument("--skip-rknn", action="store_true", help="stage 1 only: produce and self-check the graph")
    add_target_arg(p)
    # a string, not a Path: Path("engines/") drops the slash that says "a folder"
    p.add_argument("--out",
                   help="engine path, or with several targets (or a path ending in /) the folder the engines go "
                        "to (default: beside the graph, <family>-w<frames>-<target>-<graph digest>.rknn)")
    add_toolkit_arg(p)
    p.add_argument("--json", action="store_true",
                   help="stage 2: print the build and gate row as JSON instead of the summary line")


def add_toolkit_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--toolkit", metavar="VERSION",
                   help="stage 2: build with this rknn-toolkit2 version's environment, .venv-rknn-VERSION (`make "
                        "toolkit-venv TOOLKIT=VERSION`), for a board whose librknnrt is that version "
                        "(default: the toolkit installed here)")


def add_board_run_args(p: argparse.ArgumentParser, *,
                       audio_help: str | None = "write the decoded audio here (16-bit WAV)",
                       outputs_help: str = "write the decoded audio here as float32 (.npz)") -> None:
    """What every `rkstudy board run <family>` takes besides its inputs: where the audio and raw
    outputs go, the results root for the row, and the NPU core mask (no --audio when `audio_help`
    is None: the encoder makes no audio)."""
    if audio_help:
        p.add_argument("--audio", type=Path, help=audio_help)
    p.add_argument("--outputs", type=Path, help=outputs_help)
    p.add_argument("--results", type=Path, help="results root for the row (default: results/)")
    p.add_argument("--cores", choices=("0_1_2", "0", "auto"), default="0_1_2",
                   help="NPU core mask (0_1_2 falls back to auto where the driver refuses it)")
    gate = p.add_argument_group("the gate (every window or step against the fp32 graph the engine was compiled from)")
    gate.add_argument("--no-gate", action="store_true",
                      help="time the run without scoring it against fp32 (the row says ungated)")
    gate.add_argument("--reference", type=Path, metavar="FILE",
                      help="score against this reference, written on the host with --write-reference from the same "
                           "inputs (where the fp32 pass is too slow for a board), instead of running fp32 here")
    gate.add_argument("--write-reference", type=Path, metavar="FILE",
                      help="on the host, no board needed: run the job on the engines' fp32 graphs and write the "
                           "reference a board's run reads with --reference")
    p.add_argument("--allow-older-runtime", action="store_true",
                   help="run an engine of a newer rknn-toolkit2 than this board's librknnrt where that runtime is not "
                        "known to refuse it (Rockchip pairs them release for release); the row records the warning")


def add_engine_arg(p: argparse.ArgumentParser, what: str = "the .rknn (its .contract.json beside it)",
                   rungs: bool = False) -> None:
    """`--engine` of every `rkstudy board run <family>`: one engine, several, or a folder of them (the set
    `--target all` writes, one per SoC); the run takes the one this board runs (rkstudy.board.compat.choose)."""
    also = ("; repeat per width, or give folders: every width compiled for this board's SoC is a rung" if rungs
            else "; or several, or a folder of them (one per SoC from --target all): this board's is taken")
    p.add_argument("--engine", type=Path, action="append", required=True, metavar="ENGINE", help=what + also)


def refuse_mixed(p: argparse.ArgumentParser, args, stage1: tuple[str, ...]) -> None:
    """Stage-1 flags with --onnx (stage 2) are a usage error, not silently ignored."""
    if args.onnx is None:
        if args.out is not None and args.skip_rknn:
            p.error("--out names the engine, and --skip-rknn builds none")
        if getattr(args, "toolkit", None) and args.skip_rknn:
            p.error("--toolkit chooses the compiler, and --skip-rknn builds no engine")
        if getattr(args, "json", False) and args.skip_rknn:
            p.error("--json prints stage 2's row, and --skip-rknn builds no engine")
        return
    given = [f"--{name.replace('_', '-')}" for name in stage1 + ("output", "skip_rknn")
             if getattr(args, name, None) not in (None, False)]
    if given:
        p.error(f"--onnx converts a produced graph (stage 2); {', '.join(given)} belong to stage 1")


def text_to_speak(args) -> str:
    """The text of --text or --text-file. Text with nothing to say is bad input: a front end turns it
    into a few frames of silence that pass for a result."""
    if args.text is not None:
        if not args.text.strip():
            raise UsageError("--text is empty; give the text to speak, for example --text \"Hello.\"")
        return args.text
    path = Path(args.text_file)
    if not path.exists() or path.is_dir():
        raise InputError(f"no text file at {path}; give --text-file a UTF-8 file with the text to speak")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path} is not UTF-8 text; give --text-file a UTF-8 file with the text to speak") from None
    if not text.strip():
        raise InputError(f"{path} holds no text; give --text-file a UTF-8 file with the text to speak")
    return text


ARGV: list[str] = []  # the arguments of the command being run (set by rkstudy.cli.main)


def command_line() -> str:
    """The command as typed (recorded in a contract as the producer)."""
    return "rkstudy " + " ".join(ARGV or sys.argv[1:])


def print_build(report) -> None:
    print(json.dumps({**report.row(), "toolkit_version": report.toolkit_version, "engine": report.engine,
                      "log": report.log}, indent=1))


def engine_out(out: str | Path | None, targets: list[str]) -> tuple[Path | None, bool]:
    """(where stage 2 writes, whether that is a folder): an engine path for one target; with several,
    or a path that is a folder or ends in a slash (as typed: a Path has already lost it), the folder each
    target's engine (Contract.engine_name) goes to."""
    if out is None:
        return None, False
    folder = len(targets) > 1 or Path(out).is_dir() or str(out).endswith(("/", "\\"))
    out = Path(out)
    if folder and out.suffix == ".rknn":
        raise UsageError(f"--out {out} names one engine and --target names {len(targets)} SoCs "
                         f"({','.join(targets)}); give a folder for the set, such as --out engines/")
    return out, folder


def stage2(onnx_path: Path, target: str | list[str], out: Path | None, *, describe, remake: str, probe=None,
           gate=None, probed_on: str = "white noise", as_json: bool = False, toolkit: str | None = None) -> int:
    """Stage 2 of every family, for each target: read the contract back out of the graph and say in one
    line what it is (`describe(contract)`), build the engine and gate the simulator against fp32 on
    `probe`'s inputs in the same child (rkstudy.toolkit.convert.convert; white noise and that module's
    ALIVE_GATE when not given), write the compiled contract beside the engine, and print the summary line a person
    reads, or with `as_json` the row alone (a list of rows for several targets). `toolkit` builds with that
    rknn-toolkit2 version's environment. Every target is built even when one fails; returns 0, or raises
    the failure (exit 1) naming the targets that failed once the others are done."""
    from . import graph
    from .contract import from_metadata
    from .toolkit.convert import ALIVE_GATE, convert
    from .toolkit.engine_cache import name_key

    targets = [target] if isinstance(target, str) else list(target)
    out, folder = engine_out(out, targets)
    gate = gate or ALIVE_GATE
    contract = from_metadata(graph.metadata(onnx_path), where=Path(onnx_path).name, remake=remake)
    if not as_json:
        print(describe(contract), flush=True)  # before the build: it takes minutes on a wide graph
    rows, failed = [], []
    for t in targets:
        if len(targets) > 1 and not as_json:
            print(f"{t} ({targets.index(t) + 1} of {len(targets)}):", flush=True)
        engine = None
        if out is not None:
            if folder:
                out.mkdir(parents=True, exist_ok=True)
            engine = out / contract.engine_name(t, name_key(onnx_path, toolkit)) if folder else out
        try:
            done = convert(onnx_path, t, engine, probe=probe, gate=gate, remake=remake, toolkit=toolkit)
        except Failed as exc:
            if len(targets) == 1:
                raise
            print(f"{t}: {' '.join(str(exc).split())}", file=sys.stderr, flush=True)
            failed.append((t, exc))
            continue
        rows.append(stage2_row(done, gate, probed_on))
        if not as_json:
            print(summary_line(rows[-1]), flush=True)
    if as_json:
        print(json.dumps(rows[0] if len(targets) == 1 else rows, indent=1))
    if failed:
        first = failed[0][1]
        raise Failed(f"{len(failed)} of {len(targets)} targets failed ({', '.join(t for t, _ in failed)}; "
                          f"the others' engines are written): {' '.join(str(first).split())}")
    return 0


def stage2_row(done, gate, probed_on: str) -> dict:
    """What stage 2 made, as a row: the build (BuildReport.row()), the files, and the gate."""
    report = done.simulated.report
    return {**report.row(), "engine": str(done.engine), "engine_bytes": report.engine_bytes,
            "contract": str(done.engine.with_suffix(".contract.json")), "log": report.log,
            **gate.row(done.simulated.worst_snr_db), "probed_on": probed_on}


def summary_line(row: dict) -> str:
    """Stage 2 in one line: the engine, what it is (target, dtype, bytes), what the compiler said
    (REGTASK lines and their largest field value), what it cost
    (build seconds, converter peak), the simulator gate, measured against its threshold, the
    board-risk verdict of what the compiler logged (the simulator cannot see a register-field overflow),
    and what the NPU cost model predicts a call takes (npu_line)."""
    op = ">=" if row["passed"] else "<"
    return (f"{row['engine']}: {row['target']} {row['dtype']}, {row['engine_bytes']:,} bytes, REGTASK "
            f"{row['regtask']} lines (largest value {row['regtask_max_value']}), built in {row['build_s']} s, "
            f"converter peak {row['converter_peak_mb']:,.0f} MB; simulator vs fp32 on {row['probed_on']}: "
            f"{row['measured']:.1f} {row['unit']} {op} {row['threshold']:g} (gate {row['gate']}); board risk: "
            f"{row['board_risk']}; {npu_line(row)}; contract {Path(row['contract']).name}")


def npu_line(row: dict) -> str:
    """A build row's NPU cost prediction in words: ms per call on its SoC with each term (the row's npu_ms_<term>
    columns, in the model's order), said to be a prediction; or why the model cannot speak for it."""
    if row.get("npu_ms_predicted", "") == "":
        return f"NPU time per call: {row.get('npu_cost_note') or 'not predicted'}"
    terms = ", ".join(f"{k.removeprefix('npu_ms_')} {v:g}" for k, v in row.items()
                      if k.startswith("npu_ms_") and k != "npu_ms_predicted")
    return (f"the NPU cost model predicts {row['npu_ms_predicted']:g} ms per call on {row['npu_soc']} ({terms} ms; "
            "a prediction from the compiler's layer table, not a board number)")
