"""`rkstudy port lint | fold | plan | step | build | all`: a user's own conv vocoder ONNX through the
project's path, each step a subcommand (the flag convention: rkstudy.families.port.producer).

Importing this module is board safe (argparse only); the handlers import the host code they need.
"""

from __future__ import annotations

from pathlib import Path

from ...cliutil import add_target_arg, add_toolkit_arg, command_line, positive
from ...targets import TARGETS

SNR_TARGETS = (60.0, 80.0, 100.0)


def _port(args):
    from .producer import port_from_flags

    return port_from_flags(args.model, args.walk or [], args.static or [], args.output or [])


def _context(args) -> int:
    return args.context if args.context is not None else args.frames // 4


def _lint(args) -> int:
    from ...lint import lint

    port = _port(args)
    report = lint(port.path, {k: list(v) for k, v in port.shapes(args.frames).items()}, target=args.target,
                  time_inputs=port.walked_names)
    print(report.text())
    return report.exit_code


def _write_window(port, args, save: Path | None) -> Path:
    from .producer import produce_window

    produced = produce_window(port, args.frames, _context(args), sample_rate=args.sample_rate,
                              producer=command_line())
    w, c = produced.contract.window, produced.contract
    path = produced.save(save or Path(f"{port.path.stem}_w{w.frames}.onnx"))
    mask = c.role("mask")
    print(f"{port.path.name}: window {w.frames} = {w.emit} + 2x{w.context}, {port.hop} samples per frame; "
          + (f"{len(produced.masked)} node inputs masked and {len(produced.rewritten)} pads rewritten from the frame "
             f"mask {mask[0].name!r}" if mask
             else "no frame mask (the graph zeroes its own conv inputs, or it does not stream)"))
    print(f"wrote {path} (its contract in the metadata)")
    return path


def _write_step(port, args, emit: int, save: Path | None) -> Path:
    from .producer import produce_step

    produced = produce_step(port, emit, args.frames, sample_rate=args.sample_rate, producer=command_line())
    p, masks = produced.contract.params, produced.step.masks
    path = produced.save(save or Path(f"{port.path.stem}_step_e{p['emit']}.onnx"))
    print(f"{port.path.name}: stateful step of {p['emit']} frames, lookahead {p['lookahead_samples']} samples "
          f"({p['lookahead_frames']:.2f} frames), state {p['state_floats']} floats in {len(p['state_layout'])} "
          f"tensors" + (f", frame mask {masks[0]!r} ({len(produced.masked)} node inputs masked, "
                        f"{len(produced.rewritten)} pads rewritten)" if masks else ""))
    print(f"wrote {path}")
    return path


def _fold(args) -> int:
    path = _write_window(_port(args), args, args.save)
    print(f"compile it with `rkstudy port build --onnx {path} --inputs <inputs.npz>`")
    return 0


def _step(args) -> int:
    path = _write_step(_port(args), args, args.frames, args.save)
    print(f"compile it with `rkstudy port build --onnx {path} --inputs <inputs.npz>`")
    return 0


def _all(args) -> int:
    """lint (for each --target: the register field is the target's), fold, step (or the reason there is none),
    then build and gate each graph for every --target, one engine and contract per SoC."""
    from ...graph.delays import NotStreamable
    from ...lint import lint

    port = _port(args)
    for target in args.target:
        report = lint(port.path, {k: list(v) for k, v in port.shapes(args.frames).items()}, target=target,
                      time_inputs=port.walked_names)
        print(report.text())
        if report.exit_code:
            return report.exit_code
    out = args.out_dir or Path(".")
    out.mkdir(parents=True, exist_ok=True)
    emit = args.emit or args.frames
    graphs = [_write_window(port, args, out / f"{port.path.stem}_w{args.frames}.onnx")]
    try:
        graphs.append(_write_step(port, args, emit, out / f"{port.path.stem}_step_e{emit}.onnx"))
    except NotStreamable as exc:
        print(f"no stateful step: {exc}")
    for path in [] if args.skip_rknn else graphs:
        _build_graph(path, args.inputs, args.target, None, args.toolkit)
    return 0


def _plan(args) -> int:
    from ...tables import results
    from ...walk import planner
    from .sidecar import load_inputs
    from .study import plan_target

    port = _port(args)
    utterances = load_inputs(args.inputs, port.walked_names + list(port.static))
    pt = plan_target(port, utterances, args.frames, _context(args), sample_rate=args.sample_rate)
    snrs = args.snr or list(SNR_TARGETS)
    targets = args.target or ["rk3588"]
    if args.skip_rknn:  # fp32 only: the receptive field and the contexts, no builds
        tables = planner.fp32_tables(pt)
        tables["plan"] = planner.plan_rows(dict.fromkeys(targets), tables["context_sweep"], snrs)
    else:
        tables = planner.plan(pt, targets, snrs, max_window=args.max_window)
    rf = tables["receptive_field"][0]
    print(f"{port.path.name}: receptive field {rf['left_frames']} frames left, {rf['right_frames']} right "
          f"({rf['level_db']:g} dB, fp32, your inputs)")
    for r in tables["plan"]:
        window = r["largest_clean_window"]
        if args.skip_rknn:
            built = ", no window built (--skip-rknn)"
        elif window is None:
            built = f", no window within the budget ({r['budget']}; {r['confirmed_by']})"
        else:
            npu = (f"{r['npu_ms_predicted']} ms per window call predicted by the NPU cost model (not a board number)"
                   if r["npu_ms_predicted"] != "" else r["npu_cost_note"])
            built = f", largest window within the budget ({r['budget']}) {window}, emit {r['emit']}; {npu}"
        print(f"  {r['target']} at {r['snr_target_db']:g} dB: context {r['min_context_speech']} "
              f"(white noise {r['min_context_white_noise']}){built}")
    if args.results:
        for name, rows in tables.items():
            results.write_table("port", f"window_plan_{name}", [results.stamp(r) for r in rows], root=args.results,
                                title=f"port {port.path.name}: window plan ({name.replace('_', ' ')})")
        print(f"wrote {args.results / 'port'}/window_plan_*.csv")
    return 0


def _build_graph(onnx_path: Path, inputs: Path, target: str | list[str], out: Path | None,
                 toolkit: str | None = None) -> int:
    from ...cliutil import stage2
    from .producer import read_contract
    from .sidecar import input_names, load_inputs
    from .study import input_probe

    c = read_contract(onnx_path)
    utterances = load_inputs(inputs, input_names(c))
    probe = input_probe(utterances)

    def describe(contract) -> str:
        what = (f"stateful step of {contract.params['emit']} frames" if contract.state
                else f"window {contract.window.frames} = {contract.window.emit} + 2x{contract.window.context}")
        return (f"{onnx_path.name}: {contract.family}, {what}, {contract.params['hop']} samples per frame, "
                f"from {contract.source.file}")

    return stage2(onnx_path, target, out, describe=describe, remake=c.producer,
                  probe=lambda contract: probe(onnx_path, contract),
                  probed_on=f"your inputs ({len(utterances)} utterance(s), full length)", toolkit=toolkit)


def _build(args) -> int:
    return _build_graph(args.onnx, args.inputs, args.target, args.out, args.toolkit)


def _model_args(p) -> None:
    p.add_argument("model", type=Path, help="your ONNX (frame axis dynamic for `plan`)")
    p.add_argument("--walk", action="append", metavar="NAME:AXIS:RATE",
                   help="a walked input, its frame axis (the last) and its elements per latent frame "
                        "(repeat per input; a mel: mel:2:1)")
    p.add_argument("--static", action="append", metavar="NAME",
                   help="an input fed unchanged every window or step, such as a speaker embedding (repeat)")
    p.add_argument("--output", action="append", metavar="NAME:RATE",
                   help="a walked output and its samples per latent frame, the hop (audio:256; repeat)")
    p.add_argument("--frames", type=positive, required=True,
                   help="the compiled length in latent frames (the window, or the step's frames)")
    p.add_argument("--sample-rate", type=positive, default=22050, help="of the audio output (for the board's WAV)")


def add_cli(sub) -> None:
    """Register `rkstudy port lint | fold | plan | step | build | all`."""
    li = sub.add_parser("lint", help="lint your ONNX pinned to the compiled length (exit 1 on an error finding)")
    _model_args(li)
    li.add_argument("--target", choices=TARGETS, default="rk3588")
    li.set_defaults(func=_lint)

    fo = sub.add_parser("fold", help="pin to --frames, fold, add the frame mask, write the window graph and contract")
    _model_args(fo)
    fo.add_argument("--context", type=int, help="context frames each side of the window (default frames / 4)")
    fo.add_argument("--save", type=Path, help="the window ONNX to write (default <model>_w<frames>.onnx)")
    fo.set_defaults(func=_fold)

    pl = sub.add_parser("plan", help="the window plan on your inputs: receptive field, context per SNR, "
                        "largest window within the REGTASK budget")
    _model_args(pl)
    pl.add_argument("--inputs", type=Path, required=True,
                    help=".npz of real inputs by input name (NAME, NAME.1, ... for more utterances)")
    pl.add_argument("--context", type=int, help="today's window's context (default frames / 4)")
    pl.add_argument("--target", choices=TARGETS, action="append", help="repeat per target (default rk3588)")
    pl.add_argument("--snr", type=float, action="append", help="SNR targets in dB (repeat; default 60, 80, 100)")
    pl.add_argument("--max-window", type=positive, help="upper end of the search (default twice --frames)")
    pl.add_argument("--skip-rknn", action="store_true", help="fp32 only: receptive field and contexts, no builds")
    pl.add_argument("--results", type=Path, help="write the plan tables under this results root")
    pl.set_defaults(func=_plan)

    st = sub.add_parser("step", help="the stateful step of --frames frames (or the node where the graph cannot stream)")
    _model_args(st)
    st.add_argument("--save", type=Path, help="the step ONNX to write (default <model>_step_e<frames>.onnx)")
    st.set_defaults(func=_step)

    al = sub.add_parser("all", help="lint, fold, step, then build and gate each for every --target over your inputs")
    _model_args(al)
    al.add_argument("--inputs", type=Path, required=True, help=".npz of real inputs by input name")
    al.add_argument("--context", type=int, help="context frames each side of the window (default frames / 4)")
    al.add_argument("--emit", type=positive, help="frames per stateful step (default --frames)")
    add_target_arg(al)
    al.add_argument("--out-dir", type=Path, help="where the graphs and engines go (default here)")
    al.add_argument("--skip-rknn", action="store_true", help="the graphs only, no builds")
    add_toolkit_arg(al)
    al.set_defaults(func=_all)

    bu = sub.add_parser("build", help="compile a produced window or step, gate the simulator against fp32 on "
                        "your full-length inputs, write the contract beside the engine")
    bu.add_argument("--onnx", type=Path, required=True, help="a graph made by `rkstudy port fold` or `port step`")
    bu.add_argument("--inputs", type=Path, required=True, help=".npz of real inputs by input name")
    add_target_arg(bu)
    bu.add_argument("--out", type=Path, help="engine path, or with several targets the folder they go to "
                    "(default beside the graph)")
    add_toolkit_arg(bu)
    bu.set_defaults(func=_build)
