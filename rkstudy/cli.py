"""`rkstudy` command line, built from the family registry.

Exit 0 when everything passed, 1 when a gate or a build failed, 2 for bad usage or unusable input.
Every error is one line on stderr naming the fix; `--debug` shows the traceback instead.

Board side at import: the parser and the registry import nothing heavy, so `rkstudy doctor --board`
and `rkstudy board ...` run where onnx, onnxslim, torch and the toolkit are not installed; a host
command asked for there says so in one line (exit 2).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

from . import __version__
from .cliutil import Parser, positive
from .errors import RkstudyError, UsageError, one_line
from .targets import BOARD_SOCS

# What a board does not have: a host command that needs one of these says so instead of a traceback.
HOST_MODULES = ("onnx", "onnxslim", "onnxruntime", "torch", "rknn", "matplotlib", "scipy", "piper")


def parse_shapes(items: list[str] | None) -> dict[str, list[int]] | None:
    """`["z:1,192,93", "y_mask:1,1,93"]` -> `{"z": [1,192,93], ...}`."""
    if not items:
        return None
    shapes = {}
    for item in items:
        name, sep, dims = item.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = [int(d) for d in dims.split(",")]
            if any(d < 1 for d in shapes[name]):
                raise ValueError
        except ValueError:
            raise UsageError(f"--shape {item!r}: expected NAME:D0,D1,... with positive sizes, "
                             "such as z:1,192,93") from None
    return shapes


def _cmd_doctor(args) -> int:
    from . import doctor

    if args.engine and not args.board:
        raise UsageError("--engine is a board check: rkstudy doctor --board --engine E.rknn")
    return doctor.main("board" if args.board else "converter", args.engine)


def _cmd_census(args) -> int:
    from . import graph

    c = graph.census(args.onnx)
    print(json.dumps({**c.row(), "ops": dict(c.ops.most_common())}, indent=1))
    return 0


def _cmd_fold(args) -> int:
    from . import atomic, graph

    shapes = parse_shapes(args.shape) or graph.input_shapes(args.onnx)
    before = graph.census(args.onnx, with_axis=False)
    folded = graph.fold(args.onnx, shapes)
    atomic.save_onnx(folded, args.output)
    after = graph.census(folded, with_axis=False)
    print(f"{args.onnx}: {before.nodes} nodes -> {args.output}: {after.nodes} nodes "
          f"(Shape {before.hazards['Shape']} -> {after.hazards['Shape']}, "
          f"ConstantOfShape {before.hazards['ConstantOfShape']} -> {after.hazards['ConstantOfShape']})")
    return 0


def _cmd_build(args) -> int:
    from .cliutil import print_build
    from .toolkit.build import build_engine

    report = build_engine(args.onnx, args.target, parse_shapes(args.shape), args.out,
                          optimization_level=args.optimization_level, regtask_limit=args.regtask_limit,
                          reuse=not args.rebuild, timeout=args.timeout, toolkit=args.toolkit)
    print_build(report)
    report.raise_for_status()
    return 0


def _cmd_lint(args) -> int:
    from .errors import UsageError
    from .lint import lint, parse_input

    inputs = {}
    for text in args.input or []:
        name, shape = parse_input(text)
        if name in inputs:
            raise UsageError(f"--input {name} is given twice; give each input once")
        inputs[name] = shape
    report = lint(args.onnx, inputs, target=args.target, sample=args.sample)
    print(json.dumps(report.to_json(), indent=1) if args.json else report.text())
    return report.exit_code


def _cmd_bench(args) -> int:
    from .tables import bench

    if args.which == "walker":
        from .walk.bench import WALKER_BUDGET_MS, walker_overhead

        row = walker_overhead()
        print(f"walker on this host's CPU with an engine that does no work: {row['value']} ms/window over "
              f"{row['windows']} windows (budget {WALKER_BUDGET_MS} ms) -> {bench.record(row, 'walker')}")
    else:
        row = bench.make_test_wall()
        print(f"make test: {row['value']} s (budget {bench.TEST_BUDGET_S} s) -> {bench.record(row, 'make_test')}")
    return 0


def _cmd_plan_window(args) -> int:
    from .families import get
    from .tables import results
    from .walk import planner

    family = get(args.family)
    if not family.planner:
        raise UsageError(f"{family.name} is not a walked decoder; plan-window takes "
                         f"{', '.join(n for n, f in load_families().items() if f.planner)}")
    budgets = {args.target: tuple(args.budget)} if args.budget else None
    tables = planner.plan(family.resolve("planner")(), [args.target], args.snr, max_window=args.max_window,
                          budgets=budgets)
    root = args.results or results.results_root(quick=False)
    for name, rows in tables.items():
        table = "window_plan" if name == "plan" else f"window_plan_{name}"
        results.write_table(family.name, table, [results.stamp(r) for r in rows], root=root,
                            title=f"{family.name}: window plan ({name.replace('_', ' ')})")
    for rf in tables["receptive_field"]:
        label = f" ({rf['decode']})" if "decode" in rf else ""
        print(f"{family.name}: receptive field{label} {rf['left_frames']} frames left, {rf['right_frames']} right "
              f"of {rf['latent_frames']} (output change above {rf['level_db']:g} dB of its peak)")
    for r in tables["plan"]:
        window = f"largest window within the budget ({r['budget']}) {r['largest_clean_window']}"
        if r["emit"]:
            npu = (f"; the NPU cost model predicts {r['npu_ms_predicted']} ms per window call on {r['target']}, "
                   f"{r['npu_ms_per_emitted_frame_predicted']} ms per emitted frame (a prediction, not a board number)"
                   if r["npu_ms_predicted"] != "" else f"; {r['npu_cost_note']}")
            print(f"{r['target']} at {r['snr_target_db']:g} dB: context {r['min_context_speech']} (white noise "
                  f"needs {r['min_context_white_noise']}), {window}, emit {r['emit']}, compute ratio "
                  f"{r['compute_ratio']:.2f}{npu} -> --emit {r['emit']} --context {r['min_context_speech']}")
        else:
            print(f"{r['target']} at {r['snr_target_db']:g} dB: no plan (context {r['min_context_speech']}, "
                  f"{window})")
    print(f"wrote {root / family.name}/window_plan*.csv")
    return 0


def load_families():
    from .families import load_all

    return load_all()


def _cmd_results_index(args) -> int:
    from .tables import index as report

    return report.main(check=args.check)


def _cmd_reproduce(args) -> int:
    from .tables import reproduce

    return reproduce.main(args.study, restart=args.restart, listing=args.listing, jobs=args.jobs)


def _cmd_results_diff(args) -> int:
    from .tables import diff as results_diff

    return results_diff.main(args.a, args.b, args.out)


def _cmd_results_check(args) -> int:
    from .paths import REPO
    from .tables import provenance

    return provenance.main(REPO, args.results, as_json=args.json)


def _cmd_board_check(args) -> int:
    from dataclasses import asdict

    from .board import check

    c = check.board_check()
    print(json.dumps(asdict(c), indent=1) if args.json else check.render(c))
    return c.verdict.exit_code


def _cmd_board_memory(args) -> int:
    from .board import rknnrt
    from .board.memory import Budget

    budget = Budget(args.budget_mib, source="--budget-mib") if args.budget_mib else Budget.reference()
    lines, verdict = rknnrt.memory_report(args.engines, budget, rknnrt.load_library(args.library))
    print("\n".join(lines))
    if not args.budget_mib:
        print(f"(budget {budget.mib:g} MiB: the {budget.source}; measure yours and pass --budget-mib)")
    return 0 if verdict.admit else 1


def _cmd_board_dram(args) -> int:
    from dataclasses import asdict

    from .board import dram

    for threads in args.threads:
        r = dram.read_bandwidth(args.mib * 2**20 if args.mib else None, threads=threads, repeats=args.repeats,
                                factor=args.factor, cpus=args.cpus, label=args.label)
        print(json.dumps(asdict(r)) if args.json else r.line(), flush=True)
    return 0


def process_started() -> float | None:
    """When this process started (epoch seconds, to the kernel's clock tick): its start in ticks since boot from
    /proc, against the boot clock now. Where the time of a command a user typed starts; None where /proc says
    nothing."""
    import time

    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time() - age


def _cmd_speak(args) -> int:
    from .plan import audio, speak

    if args.audio is not None:
        audio.audio_format(args.audio)  # a wrong suffix is said before any work
    to_stdout = args.stream == "-"
    # with the audio on standard output, what the command says goes to standard error
    with contextlib.redirect_stdout(sys.stderr) if to_stdout else contextlib.nullcontext():
        table = speak.destination(args.speak_model, args.results)
        files = [table, table.with_suffix(".md"), *([args.audio] if args.audio else []),
                 *([Path(args.stream)] if args.stream and not to_stdout else [])]
        spoken = speak.speak(args.speak_model, args.plan, args, runtime=args.runtime, cores=args.cores,
                             writable=files, started=getattr(args, "command_started", None))
        table = speak.record(spoken, audio=args.audio, results_dir=args.results)
        print(speak.summary_line(spoken, table))
    return 0


def _add_speak(sub) -> None:
    """`rkstudy speak MODEL`: one subcommand per model with a plan schema (rkstudy.plan, from the registry)."""
    import importlib

    from .plan.engines import RUNTIMES
    from .plan.schema import schemas

    speak = sub.add_parser("speak", help="a whole text under a component execution plan (each component on the "
                           "NPU or the CPU): audio and one results row")
    models = speak.add_subparsers(dest="speak_model", required=True)
    for model, mp in schemas().items():
        comps = ", ".join(c.name for c in mp.components)
        p = models.add_parser(model, help=f"{mp.title} (components: {comps})"
                              + ("" if mp.speaker else "; the plan is checked, the model is not here"))
        p.add_argument("--plan", required=True, metavar="JSON|FILE",
                       help=f"the component execution plan ({mp.option} in the RKNN decoder-path document): a JSON "
                            f"object of components ({comps}) or a file holding one; {{}} is the CPU path")
        p.add_argument("--runtime", choices=RUNTIMES,
                       help="where the plan's NPU components run: rknnlite on a board (the default there); on the "
                            "host, simulator (the toolkit's simulator builds each engine's own graph) or onnx (each "
                            "engine's own graph in onnxruntime); default on the host: simulator for a plan of "
                            "compiled engines, onnx where it names a produced graph")
        p.add_argument("--audio", type=Path, help="write the audio here (.wav or .flac, 16-bit, at the model's rate)")
        p.add_argument("--results", type=Path, help="results root for the row (default: results/ for a board run, "
                       "build/quick-results/ on the host)")
        p.add_argument("--cores", choices=("0_1_2", "0", "auto"), default="0_1_2",
                       help="NPU core mask on a board (0_1_2 falls back to auto where the driver refuses it)")
        p.add_argument("--stream", metavar="FILE|-",
                       help="write the audio here as it is made, flushed per chunk: - is standard output as raw "
                            "16-bit mono PCM at the model's rate (| aplay -f S16_LE -r RATE -c 1; the command's "
                            "lines then go to stderr), FILE.wav a WAV growing with an open length, another name "
                            "raw PCM; a reader that goes away stops the run, exit 141, no row written")
        if mp.speaker:
            importlib.import_module(mp.speaker).add_args(p)
        p.set_defaults(func=_cmd_speak)


def _add_board_kit(board_cmds) -> None:
    """`rkstudy board check | memory | dram`: the board measurement kit (board side, stdlib/numpy/ctypes)."""
    c = board_cmds.add_parser("check", help="governor, NPU clock, driver, librknnrt, CPU clusters, and whether "
                              "this board's figures compare with the reference documents' (exit 1 when this RK3588 "
                              "keeps them from comparing; another SoC is not comparable and exits 0)")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_cmd_board_check)

    m = board_cmds.add_parser("memory", help="each engine's NPU context cost (librknnrt, no network built) and "
                              "whether the set fits one process (exit 0 admit, 1 refuse)")
    m.add_argument("engines", type=Path, nargs="+", help=".rknn engines to hold resident at once")
    m.add_argument("--budget-mib", type=float, help="per-process budget (default: the reference documents' figure, "
                   "measured on their board)")
    m.add_argument("--library", type=Path, help="librknnrt.so to use (default $LIBRKNNRT_PATH, else /usr/lib)")
    m.set_defaults(func=_cmd_board_memory)

    d = board_cmds.add_parser("dram", help="DRAM read ceiling with a working set far larger than the LLC")
    d.add_argument("--label", default="host", help="whose figure this is (printed with it)")
    d.add_argument("--threads", type=positive, nargs="+", default=[1])
    d.add_argument("--repeats", type=positive, default=5)
    d.add_argument("--factor", type=positive, default=8, help="working set as a multiple of the LLC")
    d.add_argument("--mib", type=positive, help="working set in MiB (default: factor x LLC)")
    d.add_argument("--cpus", type=int, nargs="+", help="pin to these CPUs (RK3588 A76 cluster: 4 5 6 7)")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=_cmd_board_dram)


def _cmd_bundle(args) -> int:
    from .bundle import bundle

    bundle(args.output, [m.strip() for m in args.model.split(",")] if args.model else None)
    return 0


def _add_core(sub) -> None:
    from .targets import TARGETS

    bu = sub.add_parser("bundle", help="on the host: one archive a user with only a board copies (engines for every "
                        "SoC with their contracts and fp32 graphs, the inputs, a plan per model, the source, a README)")
    bu.add_argument("--model", help="models to put in, comma-separated (default: every model with a bundle: piper, "
                    "kokoro, qwen3)")
    bu.add_argument("--output", "-o", type=Path, default=Path("rkstudy-board.tar.gz"),
                    help="the archive to write (default rkstudy-board.tar.gz)")
    bu.set_defaults(func=_cmd_bundle)

    d = sub.add_parser("doctor", help="environment versions, board presence, and what to fix")
    d.add_argument("--board", action="store_true", help="check the board side instead of the converter")
    d.add_argument("--engine", type=Path, help="with --board: check this .rknn (its contract, and its compiler "
                   "against this board's librknnrt)")
    d.set_defaults(func=_cmd_doctor)

    c = sub.add_parser("census", help="node/op counts, weight bytes, hazard ops, longest axis")
    c.add_argument("onnx", type=Path)
    c.set_defaults(func=_cmd_census)

    f = sub.add_parser("fold", help="pin input shapes and constant-fold with onnxslim")
    f.add_argument("onnx", type=Path)
    f.add_argument("--shape", action="append", help="NAME:D0,D1,... (repeat per input)")
    f.add_argument("--output", "-o", type=Path, required=True)
    f.set_defaults(func=_cmd_fold)

    b = sub.add_parser("build", help="compile an ONNX to .rknn in a child process, counting REGTASK")
    b.add_argument("onnx", type=Path)
    b.add_argument("--target", choices=TARGETS, default="rk3588")
    b.add_argument("--shape", action="append", help="NAME:D0,D1,... (default: the graph's own)")
    b.add_argument("--out", type=Path, help="engine path (default: the cache)")
    b.add_argument("--optimization-level", type=int, choices=(0, 1, 2, 3), default=3)
    b.add_argument("--regtask-limit", type=positive, default=100_000)
    b.add_argument("--timeout", type=positive, default=3 * 3600,
                   help="seconds before a hung compiler child is killed (default 3 h)")
    b.add_argument("--rebuild", action="store_true", help="ignore a cached engine")
    b.add_argument("--toolkit", metavar="VERSION",
                   help="build with this rknn-toolkit2 version's environment, .venv-rknn-VERSION "
                        "(`make toolkit-venv TOOLKIT=VERSION`; default: the toolkit installed here)")
    b.set_defaults(func=_cmd_build)

    li = sub.add_parser("lint", help="static check of RKNN hazards in an ONNX graph (exit 1 on an error finding)")
    li.add_argument("onnx", type=Path)
    li.add_argument("--input", action="append", metavar="NAME=D0xD1x...",
                    help="pin an input's shape, such as z=1x192x93 (repeat per input)")
    li.add_argument("--target", choices=TARGETS, default="rk3588")
    li.add_argument("--sample", type=Path, help=".npz of input arrays by name: adds the fp16-range rules "
                    "(every node's max |x| in an onnxruntime fp32 run)")
    li.add_argument("--json", action="store_true", help="print the report as JSON")
    li.set_defaults(func=_cmd_lint)

    k = sub.add_parser("bench", help="record a benchmark under results/benchmarks/")
    k.add_argument("which", choices=("walker", "make-test"))
    k.set_defaults(func=_cmd_bench)

    w = sub.add_parser("plan-window", help="measure a walked decoder's window: receptive field, minimum "
                       "context for an SNR, largest window within a REGTASK budget")
    w.add_argument("family", choices=sorted(n for n, f in load_families().items() if f.planner))
    w.add_argument("--target", choices=TARGETS, default="rk3588")
    w.add_argument("--snr", type=float, action="append", help="SNR targets in dB (repeat; default 60, 80, 100)")
    w.add_argument("--budget", type=positive, nargs=2, metavar=("LINES", "VALUE"),
                   help="allow an at-risk engine: up to LINES REGTASK lines with a largest field value up to VALUE "
                        "(default: clean, no REGTASK line)")
    w.add_argument("--max-window", type=positive, help="upper end of the search (default: twice today's window)")
    w.add_argument("--results", type=Path, help="results root (default: results/)")
    w.set_defaults(func=_cmd_plan_window, validate_args=lambda a: setattr(a, "snr", a.snr or [60.0, 80.0, 100.0]))

    rp = sub.add_parser("reproduce", help="every study in full mode at one clean commit (`make reproduce`): "
                        "selectable, resumable, each step timed into results/benchmarks/reproduce.csv")
    rp.add_argument("--study", nargs="+", default=[], metavar="NAME",
                    help="study names or notebook stems, such as kokoro_generator or 01b_piper_decoder_stateful "
                    "(default: every step not yet finished at this commit)")
    rp.add_argument("--restart", action="store_true", help="run every step again, even those finished at this commit")
    rp.add_argument("--jobs", type=positive, default=1,
                    help="steps run at once, longest first, as memory allows (default 1; `make reproduce` uses 2)")
    rp.add_argument("--list", action="store_true", dest="listing",
                    help="list the steps, which are finished at this commit and their expected minutes; run nothing")
    rp.set_defaults(func=_cmd_reproduce)

    r = sub.add_parser("results", help="the results index and its checks").add_subparsers(dest="what", required=True)
    i = r.add_parser("index", help="write results/README.md from the committed tables")
    i.add_argument("--check", action="store_true", help="exit 1 if the committed index differs")
    i.set_defaults(func=_cmd_results_index)
    ch = r.add_parser("check", help="exit 1 unless every table is stamped by a clean ancestor commit whose "
                      "producing code is HEAD's, with where/target and units that fit its numbers")
    ch.add_argument("--results", type=Path, help="results root (default: results/)")
    ch.add_argument("--json", action="store_true", help="print the problems as JSON")
    ch.set_defaults(func=_cmd_results_check)
    df = r.add_parser("diff", help="what moved between two result trees, with tolerances by kind of column "
                      "(exit 1 when a count, a byte size, a REGTASK line, a dB beyond 0.5 or another value moved)")
    df.add_argument("a", type=Path, help="the earlier result tree (such as the committed results/)")
    df.add_argument("b", type=Path, help="the later one")
    df.add_argument("--out", type=Path, help="write the Markdown report here (default: print it)")
    df.set_defaults(func=_cmd_results_diff)


def _add_families(sub, board_sub) -> None:
    from .families import GROUPS, load_all

    groups = {}
    for family in load_all().values():
        if family.command and family.cli:
            group, stage = family.command
            if group not in groups:
                groups[group] = sub.add_parser(group, help=GROUPS.get(group, family.title)).add_subparsers(
                    dest="stage", required=True)
            family.resolve("cli")(groups[group])
        if family.board:
            family.resolve("board")(board_sub)
    for board_parser in board_sub.choices.values():  # the gate's and the runtime's options of every board run
        board_parser.set_defaults(func=_with_board_options(board_parser.get_default("func")))


def _with_board_options(func):
    """A family's `board run` handler with the run's gate and runtime options in force (rkstudy.board.run,
    imported when the command runs: building the parser imports nothing heavy)."""
    def run(args) -> int:
        from .board.run import with_options

        return with_options(func)(args)

    return run


def parser() -> Parser:
    p = Parser(prog="rkstudy",
               description="Single TTS stages on Rockchip NPUs: surgery, builds, gates, walkers, tables.")
    p.add_argument("--version", action="version", version=f"rkstudy {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    sub = p.add_subparsers(dest="command", required=True)
    _add_core(sub)
    board = sub.add_parser("board", help=f"run on an RKNPU2 board: {BOARD_SOCS} (RKNNLite)")
    board_cmds = board.add_subparsers(dest="board_command", required=True)
    run = board_cmds.add_parser("run", help="a family's sidecar on the NPU: audio and one results row")
    _add_families(sub, run.add_subparsers(dest="family", required=True))
    _add_board_kit(board_cmds)
    _add_speak(sub)
    return p


def _error(message: str) -> None:
    # one line, long enough for the refusals that name two versions and three fixes (a compiler's dump is cut)
    print(f"rkstudy: error: {one_line(message, 1000)}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """The command line: `argv` None reads this process's own arguments (the command a user typed, whose time
    starts with the process); a list is a command run from Python (a notebook), whose time starts here."""
    import time

    from . import cliutil

    started = (process_started() if argv is None else None) or time.time()
    p = parser()
    args = p.parse_args(argv)
    args.command_started = started
    cliutil.ARGV = list(sys.argv[1:] if argv is None else argv)
    debug = args.debug or os.environ.get("RKSTUDY_DEBUG") == "1"
    with _children_debug(debug):
        return _run(args, debug)


@contextlib.contextmanager
def _children_debug(debug: bool):
    """RKSTUDY_DEBUG=1 for the children this command starts (a board run's), for its duration only."""
    before = os.environ.get("RKSTUDY_DEBUG")
    if debug:
        os.environ["RKSTUDY_DEBUG"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("RKSTUDY_DEBUG", None)
        else:
            os.environ["RKSTUDY_DEBUG"] = before


def _run(args, debug: bool) -> int:
    try:
        if getattr(args, "validate_args", None):
            args.validate_args(args)  # conflicting flags: refused by the parser (exit 2)
        return args.func(args)
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's exit code for SIGINT, no traceback
        if debug:
            raise
        _error("interrupted")
        return 130
    except Exception as exc:  # noqa: BLE001 - every error ends here as one line and an exit code
        if debug:
            raise
        if isinstance(exc, RkstudyError):
            _error(str(exc))
            return exc.exit_code
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] in HOST_MODULES:
            _error(f"`rkstudy {args.command}` needs {exc.name}, which is not installed here: on the host run "
                   "`make venv` (the converter environment); a board runs only `rkstudy doctor --board` and "
                   "`rkstudy board ...`")
            return 2
        if isinstance(exc, (FileNotFoundError, IsADirectoryError, PermissionError)):
            _error(f"{exc.strerror or exc}: {exc.filename}; check the path")
            return 2
        from .board.dmesg import RknnError

        if isinstance(exc, RknnError):
            _error(str(exc))
            return 1
        _error(f"unexpected {type(exc).__name__}: {exc} (rerun with --debug for the traceback, and please "
               "report it)")
        return 1


if __name__ == "__main__":
    sys.exit(main())
