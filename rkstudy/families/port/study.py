"""Host measurements of the port path: the user's model as a rkstudy.walk.planner.PlanTarget (the window
plan on the user's own inputs), the stateful step's exactness at both ends in float64, and the
simulator probe made of the user's inputs.

The planner measures on the graph as exported (dynamic frame axis, onnxruntime fp32): the full
decode at any length and the window walk at the window's length. Its outputs are compared frame
by frame, so a multi-channel walked output (a spectrum [1, bins, T]) is laid out frame-major: frame
k is `channels x rate` consecutive values, and the planner's hop is that product.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ... import gates
from ...errors import UsageError
from ...walk.planner import PlanTarget
from ...walk.window import Rate, walk
from .producer import Port, produce_window

# The float64 gate: the step's walk against the full-length decode, both in float64, every sample.
EXACT_GATE = gates.Gate("port_step_vs_full_decode_float64", 250.0)
# The fp32 gate: the same walk and decode in onnxruntime fp32 (the step's short convs round differently,
# nothing else), and the window walk's tail window against the full fp32 decode.
FP32_GATE = gates.Gate("port_step_vs_full_decode_fp32", 90.0)


def _frame_major(out: np.ndarray, length: int | None = None) -> np.ndarray:
    """[1, C, T] -> frame-major flat (T x C values, time slowest), first cut or zero-padded to `length`
    samples on time: an output a fixed few samples off rate x frames compares frame by frame like any other
    (its decode and its walk are cut or padded alike)."""
    out = np.asarray(out)
    if length is not None:
        out = out[..., :length]
        out = np.pad(out, [(0, 0)] * (out.ndim - 1) + [(0, length - out.shape[-1])])
    return np.ascontiguousarray(out[0].reshape(-1, out.shape[-1]).T).reshape(-1)


def _dynamic(port: Port) -> None:
    for w in port.walked:
        vi = next(i for i in port.model.graph.input if i.name == w.name)
        if vi.type.tensor_type.shape.dim[-1].HasField("dim_value"):
            raise UsageError(f"{w.name}'s frame axis is pinned in {port.path.name}; the plan decodes at every length, "
                             "so export the model with a dynamic frame axis")


def n_frames(port: Port, utterance: Mapping[str, np.ndarray]) -> int:
    w = port.walked[0]
    return utterance[w.name].shape[-1] // w.rate


def plan_target(port: Port, utterances: Sequence[Mapping[str, np.ndarray]], frames: int, context: int, *,
                sample_rate: int = 22050) -> PlanTarget:
    """The planner's view of the user's model: decode and walk through onnxruntime on the dynamic
    graph, the engine at each window from produce_window (cached), the user's utterances as latents."""
    from ...runtime import OrtRunner
    from .export import lengths

    _dynamic(port)
    extra = lengths(port, frames).extra[port.outputs[0][0]]
    runner = OrtRunner(port.model)
    out_index = [o.name for o in port.model.graph.output].index(port.outputs[0][0])
    channels = int(np.prod(runner.run(dict(utterances[0]))[out_index].shape[1:-1]))

    def decode(u):
        return _frame_major(runner.run(dict(u))[out_index], n_frames(port, u) * port.hop)

    def walked(u, emit, ctx):
        static = {s: u[s] for s in port.static}

        def one_window(feed):
            got = runner.run({**{k: v[None] for k, v in feed.items()}, **static})
            return [got[out_index][0]]

        (out,) = walk(n_frames(port, u), one_window, emit=emit, context=ctx,
                      walked={w.name: (u[w.name][0], Rate(w.rate)) for w in port.walked},
                      outputs=[Rate(port.hop, extra)], progress=False)
        return _frame_major(out[None], n_frames(port, u) * port.hop)

    def perturb(u, k, rng):
        moved = {name: np.array(v) for name, v in u.items()}
        for w in port.walked:
            x = moved[w.name]
            x[..., k * w.rate:(k + 1) * w.rate] = rng.standard_normal(x[..., :w.rate].shape) * float(np.std(x))
        return moved

    def noise_like(us, seed):
        rng = np.random.default_rng(seed)
        return [{name: (rng.standard_normal(v.shape) * float(np.std(v))).astype(np.float32)
                 if name in port.walked_names else v for name, v in u.items()} for u in us]

    def engine(window):
        return produce_window(port, window, min(context, (window - 1) // 2), sample_rate=sample_rate).save()

    return PlanTarget(family="port", hop=port.hop * channels, decode=decode, engine=engine, latents=list(utterances),
                      default_emit=frames - 2 * context, default_context=context, walk=walked, perturb=perturb,
                      noise_like=noise_like, n_frames=lambda u: n_frames(port, u))


def _edges(n: int, hop: int, edge_frames: int) -> tuple[slice, slice]:
    e = min(edge_frames, n) * hop
    return slice(0, e), slice(n * hop - e, n * hop)


def step_exactness(port: Port, step, utterance: Mapping[str, np.ndarray], edge_frames: int = 20) -> dict:
    """The step walked over `utterance` against the full-length decode of the same graph: in float64 (the
    method's own error, without fp32 rounding: every sample, the first and the last `edge_frames` frames)
    and in fp32 (the step on onnxruntime against the full decode on onnxruntime, the same three spans),
    with the fp32 full decode against the float64 one beside them (the size of fp32 rounding)."""
    from ...graph.f64 import F64Runner, run_f64
    from ...runtime import OrtRunner
    from ...walk.stateful import StatefulWalker
    from .producer import folded

    n = n_frames(port, utterance)
    full_graph = folded(port, n)
    out_index = [o.name for o in full_graph.graph.output].index(port.outputs[0][0])
    full64 = run_f64(full_graph, utterance)[out_index][0]
    full32 = OrtRunner(full_graph).run(dict(utterance))[out_index][0]
    c = step.contract
    constants = {s: utterance[s] for s in port.static}
    frames = {w.name: np.asarray(utterance[w.name])[0] for w in port.walked}
    k = [t.name for t in c.role("walked", outputs=True)].index(port.outputs[0][0])
    step64 = StatefulWalker(F64Runner(step.model), c, constants, dtype=np.float64).decode(
        {name: x.astype(np.float64) for name, x in frames.items()})[k]
    step32 = StatefulWalker(OrtRunner(step.model), c, constants).decode(
        {name: x.astype(np.float32) for name, x in frames.items()})[k]
    first, last = _edges(n, port.hop, edge_frames)
    return {"frames": n, "emit": c.params["emit"], "step_vs_full_f64_db": gates.snr_db(full64, step64),
            "first_frames_db": gates.snr_db(full64[..., first], step64[..., first]),
            "last_frames_db": gates.snr_db(full64[..., last], step64[..., last]), "edge_frames": edge_frames,
            "step_vs_full_fp32_db": gates.snr_db(full32, step32),
            "first_frames_fp32_db": gates.snr_db(full32[..., first], step32[..., first]),
            "last_frames_fp32_db": gates.snr_db(full32[..., last], step32[..., last]),
            "fp32_full_vs_f64_db": gates.snr_db(full64, full32), "gate_db": EXACT_GATE.threshold,
            "fp32_gate_db": FP32_GATE.threshold, "precision": "float64 and fp32", "where": "host"}


def window_exactness(port: Port, window, utterance: Mapping[str, np.ndarray], edge_frames: int = 20) -> dict:
    """The window graph walked over `utterance` (fp32, onnxruntime: the window sidecar with the frame mask
    it makes) against the full-length fp32 decode: every sample, the last window's frames (the tail the
    walk pads when the utterance is shorter than the window) and the first and last `edge_frames`."""
    from ...runtime import OrtRunner
    from .producer import folded
    from .sidecar import PortSidecar

    n = n_frames(port, utterance)
    full_graph = folded(port, n)
    out_index = [o.name for o in full_graph.graph.output].index(port.outputs[0][0])
    full32 = OrtRunner(full_graph).run(dict(utterance))[out_index][0]
    c = window.contract
    k = [t.name for t in c.role("walked", outputs=True)].index(port.outputs[0][0])
    walked = PortSidecar(OrtRunner(window.model), c).decode(utterance)[k]
    first, last = _edges(n, port.hop, edge_frames)
    tail = slice(max(0, n - c.window.emit) * port.hop, n * port.hop)
    return {"frames": n, "window": c.window.frames, "context": c.window.context, "padded": n < c.window.frames,
            "frame_mask": bool(c.role("mask")), "walk_vs_full_fp32_db": gates.snr_db(full32, walked),
            "tail_window_db": gates.snr_db(full32[..., tail], walked[..., tail]),
            "first_frames_db": gates.snr_db(full32[..., first], walked[..., first]),
            "last_frames_db": gates.snr_db(full32[..., last], walked[..., last]),
            "gate_db": FP32_GATE.threshold, "where": "fp32"}


def ops_handled(model) -> str:
    """The ops of a folded graph by streaming-rule family (what the surgery had to handle), each with what
    its rule notes about it (a Pad's mode, a strided or grouped conv): "conv: Conv x49 (strided 24, grouped
    24); ..."; an op no rule covers is counted under "no rule"."""
    from collections import Counter

    from ...graph.streaming import RULES

    by_family: dict[str, Counter] = {}
    notes: dict[str, Counter] = {}
    for n in model.graph.node:
        rule = RULES.get(n.op_type)
        by_family.setdefault(rule.family if rule else "no rule", Counter())[n.op_type] += 1
        notes.setdefault(n.op_type, Counter()).update(rule.note(n) if rule else [])
    parts = []
    for family in sorted(by_family):
        ops = []
        for op, k in sorted(by_family[family].items()):
            extra = ", ".join(f"{what} {c}" for what, c in sorted(notes[op].items()))
            ops.append(f"{op} x{k}" + (f" ({extra})" if extra else ""))
        parts.append(f"{family}: " + ", ".join(ops))
    return "; ".join(parts)


def fp16_storage(model, feeds: Mapping[str, np.ndarray]) -> dict:
    """What fp16 storage alone costs a graph, with no compiler: the float64 run against the same run with
    every weight and activation rounded to float16 (rkstudy.graph.f64, store="float16"), every output;
    and the largest |argument| of its Sin and Cos nodes with the float16 spacing there (a sine of an
    argument stored with that error moves by up to as much)."""
    from ...graph.f64 import run_f64

    exact = run_f64(model, feeds)
    half = run_f64(model, feeds, store="float16")
    worst = min(gates.snr_db(a, b) for a, b in zip(exact, half))
    trig = [n.input[0] for n in model.graph.node if n.op_type in ("Sin", "Cos")]
    largest = 0.0
    if trig:
        probe = onnx_with_outputs(model, trig)
        largest = max(float(np.max(np.abs(x))) for x in run_f64(probe, feeds)[-len(trig):])
    spacing = float(np.spacing(np.float16(largest))) if largest else 0.0
    return {"fp16_storage_vs_f64_db": worst, "trig_nodes": len(trig), "largest_trig_argument": largest,
            "fp16_spacing_there": spacing, "where": "host"}


def onnx_with_outputs(model, names):
    """A copy of `model` that also outputs the tensors `names` (after its own outputs)."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.graph.output.extend(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None) for t in names)
    return m


def input_probe(utterances: Sequence[Mapping[str, np.ndarray]], limit: int = 8):
    """Stage 2's probe: the engine's own feeds while the fp32 graph walks the user's full-length inputs
    (every window, or every step with the state it carried), at most `limit` of them spread over the
    walk, so the simulator gate covers the real inputs, the tail and the cache path."""
    from ...runtime import OrtRunner, Recording
    from .sidecar import PortSidecar

    def probe(onnx_path, contract):
        recording = Recording(OrtRunner(onnx_path))
        side = PortSidecar(recording, contract)
        for u in utterances:
            side.decode(u)
        feeds = recording.feeds
        keep = sorted({round(i) for i in np.linspace(0, len(feeds) - 1, min(limit, len(feeds)))})
        return [feeds[i] for i in keep]

    return probe


def codec_rows(decoders, workdir, frames: int, context: int, emit: int, utterance: Mapping[str, np.ndarray]) -> list:
    """What `port fold` and `port step` say and do for each real codec decoder (rkstudy.families.port.packages:
    a Vocoder with its torch module): the refusal (one line) where a command refuses, the output's remainder
    over rate x frames where it takes the graph, and where the step streams its exactness (step_exactness)
    and its fp32 walk against the package's own decode (the torch module) on `utterance`."""
    import onnx
    import torch

    from ...errors import InputError
    from ...runtime import OrtRunner
    from ...walk.stateful import StatefulWalker
    from .producer import port_from_flags, produce_step

    rows = []
    for name, v in decoders.items():
        path = Path(workdir) / f"{name}.onnx"
        onnx.save(v.model, path)
        row = {"decoder": name, "source": v.source, "exporter": v.exporter, "hop": v.hop,
               **dict.fromkeys(CODEC_COLUMNS)}
        try:
            port = port_from_flags(path, [f"{w}:2:1" for w in utterance], output=[f"audio:{v.hop}"])
        except InputError as exc:   # every command starts here
            rows.append({**row, "fold": "refused", "step": "refused", "fold_says": str(exc), "step_says": str(exc)})
            continue
        try:
            window = produce_window(port, frames, context)
            row.update(fold="ok", fold_says="", output_extra=window.contract.outputs[0].extra)
        except InputError as exc:
            row.update(fold="refused", fold_says=str(exc))
        try:
            step = produce_step(port, emit, frames)
        except InputError as exc:
            rows.append({**row, "step": "refused", "step_says": str(exc)})
            continue
        exact = step_exactness(port, step, utterance)
        with torch.no_grad():
            own = v.module(*(torch.from_numpy(x) for x in utterance.values())).numpy()[0]
        (walked,) = StatefulWalker(OrtRunner(step.model), step.contract).decode(
            {k: x[0] for k, x in utterance.items()})
        extra = step.contract.params["output_extra"]["audio"]
        rows.append({**row, "step": "ok", "step_says": "", "step_output_extra": extra,
                     "samples": walked.shape[-1], "package_samples": own.shape[-1],
                     "step_vs_package_fp32_db": gates.snr_db(own, walked) if own.shape == walked.shape else None,
                     **{k: exact[k] for k in CODEC_COLUMNS[-7:]}})
    return rows


# every codec row's columns after its name, source, exporter and hop (None where a command refused)
CODEC_COLUMNS = ("fold", "fold_says", "output_extra", "step", "step_says", "step_output_extra", "samples",
                 "package_samples", "step_vs_package_fp32_db", "frames", "step_vs_full_f64_db", "first_frames_db",
                 "last_frames_db", "step_vs_full_fp32_db", "first_frames_fp32_db", "last_frames_fp32_db")


def lint_vs_build(v, workdir, frames: Sequence[int], target: str = "rk3588") -> list:
    """For one decoder (a packages.Vocoder) at each window length: what `port lint` predicts of its dilated
    convs' register field (RK305: REGTASK lines, severity, the lint exit code, whether the compiler decides)
    beside what the window graph's real build logged (rkstudy.toolkit.build.build_engine)."""
    import onnx

    from ...lint import lint
    from ...toolkit.build import build_engine
    from .producer import port_from_flags

    path = Path(workdir) / f"{v.name}_lint.onnx"
    onnx.save(v.model, path)
    port = port_from_flags(path, ["z:2:1"], output=[f"audio:{v.hop}"])
    rows = []
    for n in frames:
        report = lint(path, {k: list(s) for k, s in port.shapes(n).items()}, target=target, time_inputs=["z"])
        found = [f for f in report.findings if f.code == "RK305"]
        window = produce_window(port, n, max(1, n // 4)).save(Path(workdir) / f"{v.name}_w{n}.onnx")
        built = build_engine(window, target)
        predicted = sum(f.detail.get("predicted_lines", 0) for f in found)
        # the lines a finished build logged, or lint's error where the build was killed past the REGTASK limit
        held = (built.regtask == predicted if built.ok else
                built.status == "regtask-limit" and any("the build is killed" in f.message for f in found))
        rows.append({"decoder": v.name, "window": n, "target": target, "lint_exit": report.exit_code,
                     "rk305": max((f.severity for f in found), key=("warning", "error").index, default="none"),
                     "compiler_decides": bool(report.undecided),
                     "predicted_regtask": predicted, "prediction_held": held,
                     "largest_predicted_value": max((f.detail["field_value"] for f in found), default=0),
                     **{k: built.row()[k] for k in ("status", "regtask", "regtask_max_value", "build_s", "where",
                                                    "board_risk")}})
    return rows
