"""Command-line pieces every family command shares (board side: argparse only).

Exit codes and messages follow rkstudy.errors: one line on stderr naming the fix; 2 for bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .contract import TARGETS
from .errors import InputError, UsageError


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


def add_stage_args(p: argparse.ArgumentParser, *, output_help: str = "where stage 1 writes the graph") -> None:
    """The two-stage flags every producer takes: stage 1 writes a graph (--skip-rknn --output X),
    stage 2 converts one (--onnx X --target T [--out E])."""
    p.add_argument("--onnx", type=Path, help="stage 2: a produced graph; its contract is read from it")
    p.add_argument("--output", type=Path, help=output_help + " (always rewritten)")
    p.add_argument("--skip-rknn", action="store_true", help="stage 1 only: produce and self-check the graph")
    p.add_argument("--target", choices=TARGETS, default="rk3588")
    p.add_argument("--out", type=Path,
                   help="engine path (default: beside the graph, <family>-w<frames>-<target>-<graph digest>.rknn)")
    p.add_argument("--json", action="store_true",
                   help="stage 2: print the build and gate row as JSON instead of the summary line")


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


def refuse_mixed(p: argparse.ArgumentParser, args, stage1: tuple[str, ...]) -> None:
    """Stage-1 flags with --onnx (stage 2) are a usage error, not silently ignored."""
    if args.onnx is None:
        if args.out is not None and args.skip_rknn:
            p.error("--out names the engine, and --skip-rknn builds none")
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


def stage2(onnx_path: Path, target: str, out: Path | None, *, describe, remake: str, probe=None, gate=None,
           probed_on: str = "white noise", as_json: bool = False) -> int:
    """Stage 2 of every family: read the contract back out of the graph and say in one line what it
    is (`describe(contract)`), build the engine and gate the simulator against fp32 on `probe`'s
    inputs in the same child (rkstudy.toolkit.convert.convert; white noise and engine.ALIVE_GATE when not
    given), write the compiled contract beside the engine, and print the summary line a person
    reads, or with `as_json` the row alone. Returns 0; a failed build or gate raises (exit 1)."""
    from . import graph
    from .contract import from_metadata
    from .toolkit.convert import ALIVE_GATE, convert

    gate = gate or ALIVE_GATE
    contract = from_metadata(graph.metadata(onnx_path), where=Path(onnx_path).name, remake=remake)
    if not as_json:
        print(describe(contract), flush=True)  # before the build: it takes minutes on a wide graph
    done = convert(onnx_path, target, out, probe=probe, gate=gate, remake=remake)
    row = stage2_row(done, gate, probed_on)
    print(json.dumps(row, indent=1) if as_json else summary_line(row))
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
    (build seconds, converter peak), the simulator gate, measured against its threshold, and the
    board-risk verdict of what the compiler logged (the simulator cannot see a register-field overflow)."""
    op = ">=" if row["passed"] else "<"
    return (f"{row['engine']}: {row['target']} {row['dtype']}, {row['engine_bytes']:,} bytes, REGTASK "
            f"{row['regtask']} lines (largest value {row['regtask_max_value']}), built in {row['build_s']} s, "
            f"converter peak {row['converter_peak_mb']:,.0f} MB; simulator vs fp32 on {row['probed_on']}: "
            f"{row['measured']:.1f} {row['unit']} {op} {row['threshold']:g} (gate {row['gate']}); board risk: "
            f"{row['board_risk']}; contract {Path(row['contract']).name}")
