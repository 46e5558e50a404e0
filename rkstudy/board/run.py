"""`rkstudy board run <family>`: a family's sidecar on RKNNLite, measured in a dedicated child process.

The parent checks that this is a board, validates the engine's contract (engine bytes unchanged,
compiled for this SoC, carved from the same source as the inputs), starts a child (rkstudy.board.child,
the launcher `rkstudy speak` uses too) that loads the engine and runs the family's job; the child reports
its own peak RSS (VmHWM: the sidecar, its runtime and its engine), comparable with the reference documents'
process figure and not the notebook kernel's.
While the job runs, the child samples the driver's per-core NPU load in a background thread
(rkstudy.board.load; the reference documents read that file to find that the AUTO mask leaves two cores idle).
After the measurement the same child gates the run (rkstudy.board.gate): every window or step of every engine
against the fp32 graph it was compiled from, at the floor stage 2 held the simulator to; below it the run ends
with exit 1 and one line, and nothing is written. The parent then writes the audio and appends one results row:
wall time, audio seconds, RTF, peak RSS, per-core NPU load (mean and max), NPU governor and frequency, driver
and runtime versions, engine and contract digests, the gate's verdict and worst window (or `ungated` under
--no-gate), and where it ran (`board`, or `replay` through the test double). On the host, `--write-reference`
runs the same job on the engines' fp32 graphs and writes the reference a board's gate reads with `--reference`
where that pass is too slow for the board.

Board side: standard library and numpy only.
"""

from __future__ import annotations

import contextvars
import json
import os
import sys
import wave
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import atomic
from ..cache import sha256_file
from ..contract import Contract, beside, for_engine
from ..errors import BoardUnavailable, InputError, UsageError
from ..tables import results
from ..targets import BOARD_SOCS
from . import compat, gate, sysfs
from .child import child_main, job_named, run_child, write_child_result
from .runner import board_available

NO_BOARD = (f"`rkstudy board run` runs on an RKNPU2 board ({BOARD_SOCS}) with "
            "rknn-toolkit-lite2 and the rknpu driver, and this machine has {why}; on the host use the simulator "
            "(the study notebooks)")


@dataclass(frozen=True)
class BoardOptions:
    """What every `rkstudy board run <family>` takes about the gate and the runtime (cliutil.add_board_run_args),
    in force while its command runs (with_options): the families' own code never passes them on."""

    no_gate: bool = False
    reference: Path | None = None
    write_reference: Path | None = None
    allow_older_runtime: bool = False


_options: contextvars.ContextVar[BoardOptions | None] = contextvars.ContextVar("board_options", default=None)


def options() -> BoardOptions:
    return _options.get() or BoardOptions()


def with_options(func: Callable) -> Callable:
    """`func(args)` (a family's `board run` handler) with the run's BoardOptions in force; conflicting ones are a
    usage error."""
    def run(args) -> int:
        opts = BoardOptions(no_gate=bool(getattr(args, "no_gate", False)), reference=getattr(args, "reference", None),
                            write_reference=getattr(args, "write_reference", None),
                            allow_older_runtime=bool(getattr(args, "allow_older_runtime", False)))
        if opts.no_gate and (opts.reference or opts.write_reference):
            raise UsageError("--no-gate runs for timing only; --reference and --write-reference are the gate's")
        if opts.reference and opts.write_reference:
            raise UsageError("--write-reference makes the reference on the host; --reference reads it on the board")
        token = _options.set(opts)
        try:
            return func(args)
        finally:
            _options.reset(token)

    return run


def require_board() -> None:
    if options().write_reference:  # the host writes the fp32 reference: no board, no NPU
        return
    present, why = board_available()
    if not present:
        raise BoardUnavailable(NO_BOARD.format(why=why[0].lower() + why[1:]))


def board_soc() -> str:
    """This board's SoC as the toolkit names it; BoardUnavailable when the device tree does not say."""
    soc = sysfs.soc()
    if soc is None:
        raise BoardUnavailable(f"cannot tell this board's SoC: no rockchip,rkXXXX entry in {sysfs.COMPATIBLE}")
    return soc


def pick(given, family: str, *, several: bool = False, remake: str | None = None) -> list[Path]:
    """The engines of `given` (`--engine` paths or folders, one engine per SoC from `--target all`) this
    board runs (rkstudy.board.compat.choose), saying which it took when there was a choice."""
    given = [given] if isinstance(given, (str, Path)) else list(given)
    soc = None if options().write_reference else board_soc()  # one graph serves every SoC's engine
    chosen = compat.choose(given, family=family, soc=soc, several=several, remake=remake)
    offered = compat.engine_files(given)
    if len(offered) > len(chosen):
        who = f"this {soc} board runs" if soc else "the reference is the fp32 graph of"
        print(f"{who} {', '.join(p.name for p in chosen)} (of {len(offered)} engines given)")
    return chosen


def write_wav(path: Path | str, pcm: np.ndarray, sample_rate: int) -> Path:
    """16-bit mono WAV with the standard library (the board needs no soundfile)."""
    data = (np.clip(np.asarray(pcm, np.float64).ravel(), -1.0, 1.0) * 32767).astype("<i2").tobytes()
    with atomic.replacing(path) as tmp:
        with wave.open(str(tmp), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(int(sample_rate))
            w.writeframes(data)
    return Path(path)


def append_row(study: str, table: str, row: dict, root: Path) -> Path:
    """Add one stamped row to `<root>/<study>/<table>.csv` (rewritten whole, atomically); a table
    whose columns differ from the row's is refused rather than mixed."""
    path = Path(root) / study / f"{table}.csv"
    rows = results.read_table(path) if path.is_file() else []
    if rows and list(rows[0]) != list(row):
        raise InputError(f"{path} has other columns than this run's row; pass --results DIR for a fresh table")
    return results.write_table(study, table, rows + [row], root=root, title=f"Board runs: {table}")


def invoking_user() -> tuple[int, int] | None:
    """(uid, gid) of the user who ran sudo, when this process is root under sudo; None otherwise."""
    if os.geteuid() != 0:
        return None
    try:
        return int(os.environ["SUDO_UID"]), int(os.environ["SUDO_GID"])
    except (KeyError, ValueError):
        return None


def _missing_dirs(path: Path) -> tuple[list[Path], Path]:
    """The folders writing `path` will create (outermost last), and the existing folder above them."""
    missing, folder = [], path.parent
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    return missing, folder


def require_writable(paths: list[Path]) -> None:
    """Refuse, before a decode, outputs this user cannot write (an earlier run under sudo left them
    root-owned): files are replaced atomically, so their folder must be writable too."""
    for path in paths:
        folder = _missing_dirs(path)[1] if not path.exists() else path.parent
        blocked = path if path.exists() and not os.access(path, os.W_OK) else (
            folder if not os.access(folder, os.W_OK) else None)
        if blocked is not None:
            import pwd

            try:
                owner = pwd.getpwuid(blocked.stat().st_uid).pw_name
            except KeyError:
                owner = str(blocked.stat().st_uid)
            raise InputError(f"{blocked} is not writable by this user (owned by {owner}, perhaps by an earlier run "
                             f"under sudo): sudo chown -R $USER {blocked}, or pass --results DIR")


def hand_back(paths: list[Path], created: list[Path]) -> None:
    """Under sudo, give what this run wrote (and the folders it made) to the user who ran sudo, so a
    later run without sudo can append to the same table."""
    owner = invoking_user()
    if owner is None:
        return
    for path in [*created, *paths]:
        if path.exists():
            os.chown(path, *owner)


def measure(family: str, *, engine: Path, job: str, payload: dict, cores: str = "0_1_2",
            audio_out: Path | None = None, outputs_out: Path | None = None, results_dir: Path | None = None,
            source_sha256: str | None = None, extra: dict | None = None, remake: str | None = None,
            timeout: float | None = None, also: Sequence[Path] = ()) -> dict:
    """Run `job` ("module:function") for `family` on `engine` in a dedicated child, gate it; return the row.

    `payload` is the job's input (JSON-able: paths, not arrays); `source_sha256` is the digest of the
    model the inputs came from, checked against every engine's contract source; `also` are the other
    engines the job loads (a ladder's rungs, a streaming first step), checked like `engine` (family, bytes,
    SoC, a librknnrt that runs them, source, the gate's floor and fp32 graph) before the child starts; `remake`
    is the command a refusal names (default: the family's `--help`); `timeout` bounds the child (default
    $RKSTUDY_BOARD_TIMEOUT or rkstudy.board.child.CHILD_TIMEOUT_S). Below the gate: GateFailed (exit 1), one line,
    nothing written. Ctrl-C, SIGHUP or SIGTERM stop the child and write nothing (rkstudy.board.child.run_child).
    Under `--write-reference` (the host) the job runs on the fp32 graphs and the reference file is written
    instead of a row (an empty dict is returned).
    """
    opts = options()
    if opts.write_reference:
        return _write_reference(family, engine=engine, job=job, payload=payload, remake=remake,
                                source_sha256=source_sha256, timeout=timeout, also=also)
    require_board()
    soc = board_soc()
    contracts, warnings = {}, []
    for path in [engine, *also]:
        contract, warning = compat.checked(path, family=family, soc=soc, remake=remake, source_sha256=source_sha256,
                                           allow_older=opts.allow_older_runtime)
        contracts[Path(path).name] = contract
        warnings += [warning] if warning and warning not in warnings else []
    contract = contracts[Path(engine).name]
    gated = gate.request(opts, family, payload, contracts)
    if gated["mode"] == gate.BOARD:
        gate.check_graphs([engine, *also], contracts)
    root = Path(results_dir) if results_dir else results.results_root(quick=False)
    table_csv = root / "board" / f"{family}.csv"
    outputs = [table_csv, table_csv.with_suffix(".md")] + [Path(p) for p in (audio_out, outputs_out) if p is not None]
    require_writable(outputs)
    created = sorted({d for p in outputs for d in _missing_dirs(p)[0]})
    spec = {"job": job, "engine": str(Path(engine).resolve()), "cores": cores, "payload": payload, "gate": gated}
    result, arrays = run_child("rkstudy.board.run", spec, label=f"the board run of {Path(engine).name}",
                               prefix="rkstudy-board-", timeout=timeout)
    verdict = gate.verdict(result, contracts)  # GateFailed below the gate: nothing written
    pcm = arrays.pop("audio", np.zeros(0, np.float32))
    checked = {**verdict.row, "runtime_warning": "; ".join(warnings)}
    try:  # what is written is handed back under sudo even when a later write fails or is interrupted
        return _write(family, engine, contract, result, arrays, pcm, extra, checked, audio_out, outputs_out, root)
    finally:
        hand_back(outputs, created)


def _write_reference(family, *, engine, job, payload, remake, source_sha256, timeout, also) -> dict:
    """The host's half of a carried reference: the job on every engine's fp32 graph (no board), each call's
    outputs and the audio written to the --write-reference file with the inputs' and the graphs' digests."""
    target = Path(options().write_reference)
    contracts = {}
    for path in [engine, *also]:
        c = contracts[Path(path).name] = for_engine(path, family=family, remake=remake)
        if source_sha256 is not None and source_sha256 != c.source.sha256:
            raise InputError(f"the inputs come from a model with sha256 {source_sha256[:12]} and {Path(path).name} "
                             f"was made from {c.source.file} ({c.source.sha256[:12]}); make inputs from it")
    gate.check_graphs([engine, *also], contracts)
    require_writable([target])
    spec = {"job": job, "engine": str(Path(engine).resolve()), "cores": "0_1_2", "payload": payload,
            "gate": {"mode": gate.WRITE}}
    result, arrays = run_child("rkstudy.board.run", spec, label=f"the fp32 reference of {Path(engine).name}",
                               prefix="rkstudy-reference-", timeout=timeout)
    gate.Reference.write(target, family=family, payload=payload, meta=result["reference"], arrays=arrays)
    calls = len(result["reference"]["calls"])
    print(f"wrote {target} (the fp32 reference of {calls} engine calls; pass it to `rkstudy board run {family} ... "
          "--reference` on the board, with the same inputs)")
    return {}


def _write(family, engine, contract, result, arrays, pcm, extra, checked, audio_out, outputs_out, root) -> dict:
    """The run's audio, raw outputs and results row (`checked`: the gate's columns and the runtime's warning)."""
    row = {"family": family, "engine": Path(engine).name, "dtype": contract.dtype,
           "engine_sha256": contract.engine.sha256[:16],
           "contract_sha256": sha256_file(beside(engine))[:16], "source": contract.source.file,
           **(extra or {}), **result.get("row", {}), "wall_s": round(result["seconds"], 4),
           "audio_s": round(result["audio_s"], 3),
           "rtf": result["seconds"] / result["audio_s"] if result["audio_s"] else float("nan"),
           "peak_rss_mb": round(result["peak_rss_kb"] / 1024, 1), **result["npu_load"], "cores": result["cores"],
           **result["npu_clock"],
           "driver": sysfs.npu_driver_version() or "", "runtime": result.get("runtime") or "",
           **checked, "where": result["where"], "target": result["target"]}
    row = results.stamp(row)
    if audio_out is not None and pcm.size:
        write_wav(audio_out, pcm, result["sample_rate"])
        print(f"wrote {audio_out} ({result['audio_s']:.2f} s at {result['sample_rate']} Hz)")
    if outputs_out is not None:
        import io

        buf = io.BytesIO()
        np.savez(buf, audio=pcm, **arrays)
        atomic.write_bytes(outputs_out, buf.getvalue())
        print(f"wrote {outputs_out} (the engine's outputs, float32)")
    table = append_row("board", family, row, root)
    audio = f"RTF {row['rtf']:.4f}, {row['audio_s']:.2f} s of audio, " if row["audio_s"] else ""
    npu = (f", NPU load mean {row['npu_load_mean_pct']} % max {row['npu_load_max_pct']} % per core"
           if row["npu_load_samples"] else "")
    print(f"{family} on {row['where']} ({row['target']}, cores {row['cores']}): {audio}{row['wall_s']:.3f} s, "
          f"peak RSS {row['peak_rss_mb']} MB{npu}; {gate_summary(row)} -> {table}")
    return row


def gate_summary(row: dict) -> str:
    """The gate's verdict in a few words, for the run's summary line."""
    if row["gate"] == gate.UNGATED:
        return row["gate"]
    if not row["gate_worst"]:
        return f"gate {row['gate']}: {row['gate_windows']}"
    heard = ", ".join(f"{k} {row[k]}" for k in ("pesq_wb", "stoi") if row[k] != "")
    return (f"gate {row['gate']} passed: worst {row['gate_worst']} at {row['gate_worst_snr_db']} dB (>= "
            f"{row['gate_threshold_db']:g} dB){', ' + heard if heard else ''}")


def _child(spec_path: str) -> int:
    """The child: run the job (on the NPU, every call spooled while the gate is on), write its audio and its
    result with its own peak RSS; then, the measurement done, the gate's reference pass and scores."""
    spec = json.loads(Path(spec_path).read_text())
    job = job_named(spec["job"])
    contract: Contract = for_engine(spec["engine"])  # already validated by the parent; re-read here
    check = gate.Check.from_spec(spec)

    def run() -> dict:
        return job(contract=contract, engine=Path(spec["engine"]), cores=spec["cores"], payload=spec["payload"])

    if check.mode == gate.WRITE:
        meta, arrays = check.write_pass(run)
        write_child_result(spec, {"audio": arrays.pop("audio"), "arrays": arrays, "reference": meta})
        return 0
    write_child_result(spec, gate.gated_child(spec, run))
    return 0


def main(argv=None) -> int:
    """The child's entry (rkstudy.board.child.child_main)."""
    return child_main(argv, _child, "rkstudy board run")


if __name__ == "__main__":
    sys.exit(main())
