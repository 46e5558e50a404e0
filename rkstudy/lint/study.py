"""The lint study's measurements (host): what notebook 06 calls.

Every graph the family studies compile, linted before and after the family's rewrite (raw slice
against produced slice, folded against rewritten), and `rkstudy lint` run as a command on those
graphs (which the tests never see) to record its exit codes.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import onnx

from ..results import HOST
from . import Report, lint


@dataclass
class FamilyGraph:
    """One graph a family study compiles: which family and stage (raw / rewritten), the graph, the
    input shapes lint pins, and a real input for the fp16-range rules."""

    family: str
    stage: str
    label: str
    model: onnx.ModelProto
    inputs: Mapping[str, tuple] = field(default_factory=dict)
    sample: Mapping[str, np.ndarray] | None = None


def toolchain_graphs(lengths: Iterable[int]) -> list[FamilyGraph]:
    """The toolchain probes: the vocoder probe (and its Sin rewritten) and the long-axis convs."""
    from ..families.toolchain.probes import long_axis_probe, vocoder_probe
    from ..graph.sine import reduce_sin

    x = {"x": np.random.default_rng(1).standard_normal((1, 16, 1, 64)).astype(np.float32)}
    out = [FamilyGraph("toolchain", "raw", "vocoder_probe", vocoder_probe(), sample=x),
           FamilyGraph("toolchain", "rewritten", "vocoder_probe, sine.reduce_sin", reduce_sin(vocoder_probe()),
                       sample=x)]
    out += [FamilyGraph("toolchain", "raw", f"long_axis_probe L={n}", long_axis_probe(n)) for n in lengths]
    return out


def _window_sample(z: np.ndarray, window: int) -> dict[str, np.ndarray]:
    """A real latent's first window (zero-padded), with its mask."""
    c, n = z.shape
    zz = np.zeros((1, c, window), np.float32)
    zz[0, :, : min(n, window)] = z[:, :window]
    mask = np.zeros((1, 1, window), np.float32)
    mask[..., : min(n, window)] = 1
    return {"z": zz, "y_mask": mask}


def decoder_graphs(voice, text: str = "short") -> list[FamilyGraph]:
    """Piper decoder: the pinned slice as cut (unfolded), the produced slice, and the produced slice with
    the decoder mask upsampled by ConvTranspose (the producer's) and by Resize (the measured failure)."""
    from ..families.piper.voice import read_text
    from ..families.piper_decoder.producer import DEFAULT_CONTEXT, DEFAULT_EMIT, decoder_graph, produce_for_voice

    window = DEFAULT_EMIT + 2 * DEFAULT_CONTEXT
    sample = _window_sample(voice.latents(read_text(text))[0].z, window)
    out = [FamilyGraph("piper_decoder", "raw", f"slice pinned at {window}, unfolded",
                       decoder_graph(voice.model, voice.seam, window), sample=sample),
           FamilyGraph("piper_decoder", "rewritten", "produced (folded)", produce_for_voice(voice).model,
                       sample=sample),
           FamilyGraph("piper_decoder", "rewritten", "produced --dec-mask (ConvTranspose mask upsampler)",
                       produce_for_voice(voice, dec_mask=True).model, sample=sample),
           FamilyGraph("piper_decoder", "raw", "--dec-mask with a Resize mask upsampler (measured on the board)",
                       produce_for_voice(voice, dec_mask=True, upsampler="resize").model, sample=sample)]
    return out


def inflect_graphs(voice) -> list[FamilyGraph]:
    """Inflect v2 decode.onnx (carved from the voice): the pinned slice unfolded, and the produced one."""
    from ..families.inflect_decoder import carve
    from ..families.piper_decoder.producer import decoder_graph, produce_for_voice

    decode = carve.DecodeModel(carve.save_carved(voice))
    window = carve.EMIT + 2 * carve.CONTEXT
    return [FamilyGraph("inflect_decoder", "raw", f"slice pinned at {window}, unfolded",
                        decoder_graph(decode.model, decode.seam, window)),
            FamilyGraph("inflect_decoder", "rewritten", "produced (folded, decoder mask)",
                        produce_for_voice(decode, emit=carve.EMIT, context=carve.CONTEXT, dec_mask=True).model)]


def encoder_graphs(voice, widths: Iterable[int]) -> list[FamilyGraph]:
    """Piper encoder per width: the raw slice linted at the width, the folded slice (chains left) and the
    rewritten one (what the engine is compiled from), each with real padded tokens as the sample."""
    from ..families.piper_encoder import producer as pe
    from ..families.piper_encoder.seam import shapes_for
    from ..families.piper_encoder.tokens import pad_ids, real_tokens

    out = []
    for w in widths:
        product = pe.produce(voice, w)
        sample = pad_ids(real_tokens(voice, w - 1), w)
        pins = {k: tuple(v) for k, v in shapes_for(w).items()}
        out += [FamilyGraph("piper_encoder", "raw", f"slice at width {w}, dynamic (linted pinned)", product.raw,
                            pins, sample),
                FamilyGraph("piper_encoder", "raw", f"folded at width {w} (chains left)", product.folded,
                            sample=sample),
                FamilyGraph("piper_encoder", "rewritten", f"rewritten at width {w}", product.rewritten, sample=sample)]
    return out


def stateful_graphs(voice, emit: int = 45) -> list[FamilyGraph]:
    """Piper stateful decoder: the --dec-mask window slice the surgery starts from, and the step cut
    from it (the caches as graph I/O), each with a real latent window (the step's state zeroed)."""
    from ..families.piper.voice import read_text
    from ..families.piper_decoder_stateful.producer import produce_step_for_voice

    produced = produce_step_for_voice(voice, emit)
    z = voice.latents(read_text("short"))[0].z
    window = produced.slice.contract.window.frames
    step_in = {i.name: tuple(d.dim_value for d in i.type.tensor_type.shape.dim) for i in produced.model.graph.input}
    step_sample = {k: np.zeros(shape, np.float32) for k, shape in step_in.items()}
    step_sample.update({k: v[..., : step_in[k][-1]] for k, v in _window_sample(z, step_in["z"][-1]).items()})
    return [FamilyGraph("piper_decoder_stateful", "raw", f"--dec-mask slice at {window} (before the step surgery)",
                        produced.slice.model, sample=_window_sample(z, window)),
            FamilyGraph("piper_decoder_stateful", "rewritten", f"stateful step at E={emit}", produced.model,
                        sample=step_sample)]


def flow_graphs(frames: int = 64, depth: int = 2) -> list[FamilyGraph]:
    """Flow estimator (the DiT stand-in, random weights): the TorchScript export as it comes out, and
    the graph folded at the pinned shapes (what the engine is built from), with the contract's feeds."""
    import tempfile
    from pathlib import Path

    from ..families.flow_estimator import producer as fp
    from ..families.flow_estimator import standin

    product = fp.produce(frames, depth=depth)
    cfg = standin.standin_config(depth)
    with tempfile.TemporaryDirectory(prefix="rkstudy-lint-dit-") as tmp:
        raw = onnx.load(str(standin.export(standin.build(cfg), frames, Path(tmp) / "raw.onnx")))
    sample = fp.feeds(product.contract)
    return [FamilyGraph("flow_estimator", "raw", f"exported at S={frames}, depth {depth} (unfolded)", raw,
                        sample=sample),
            FamilyGraph("flow_estimator", "rewritten", f"folded at S={frames}, depth {depth}",
                        onnx.load(str(product.path)), sample=sample)]


def kokoro_graphs(frames: int = 128, wide: int | None = 256, max_axis: int = 60 * 134 + 1) -> list[FamilyGraph]:
    """Kokoro generator: the re-traced trunk with no rewrites (weight norm traced, exact sine, no
    masks) against the engine's graph at `frames`; the exact sine left alone; and, with `wide`, the
    monolithic wide window (raw-sum statistics, the seeds' form) against the in-graph walk (notebook
    03's: inner windows of 134 frames, whose largest REGTASK field value stays inside 8191)."""
    from ..families.kokoro_generator import producer as kp
    from ..families.kokoro_generator.generator import ENGINE, REFERENCE, Rewrites

    model = kp.load_model()
    utt = model.utterance(kp.PROBE_UTTERANCE)

    def sample(w: int, names=kp.INPUTS) -> dict[str, np.ndarray]:
        feed = kp.window_feed(utt.x, utt.har, utt.style, 0, min(utt.frames, w), w)
        return {k: feed[k] for k in names}

    raw = kp.export(model.trunk(replace(REFERENCE, weight_norm=True)),
                    {k: v for k, v in kp.window_shapes(frames).items() if k in ("x", "har", "style")},
                    fold=False, constant_folding=False)
    out = [FamilyGraph("kokoro_generator", "raw", f"trunk at W={frames}: no rewrites (weight norm traced, exact "
                       "sine, unmasked)", raw, sample=sample(frames, ("x", "har", "style"))),
           FamilyGraph("kokoro_generator", "raw", f"every exact rewrite at W={frames}, exact sine",
                       onnx.load(str(kp.produce(frames, rw=Rewrites(sine="exact"), model=model).path)),
                       sample=sample(frames)),
           FamilyGraph("kokoro_generator", "rewritten", f"the engine's graph at W={frames}",
                       onnx.load(str(kp.produce(frames, rw=ENGINE, model=model).path)), sample=sample(frames))]
    if wide:
        out += [FamilyGraph("kokoro_generator", "raw", f"W={wide} in one window, raw-sum statistics",
                            onnx.load(str(kp.produce(wide, rw=Rewrites(stats="sum"), model=model).path)),
                            sample=sample(wide)),
                FamilyGraph("kokoro_generator", "rewritten", f"W={wide} walked in the graph (--max-axis {max_axis})",
                            onnx.load(str(kp.produce(wide, rw=ENGINE, max_axis=max_axis, model=model).path)),
                            sample=sample(wide))]
    return out


def qwen3_graphs(codes_length: int = 16, exporters: Iterable[str] = ("torchscript17_dynamic",)) -> list[FamilyGraph]:
    """Qwen3 vocoder step (seeded random weights): the TorchScript export before the long-axis
    rewrite and the other exporter settings (a dynamic one linted at the static step's shapes)
    against the produced step, with a real carried cache as the sample."""
    from ..families.qwen3_vocoder import producer as qp
    from ..families.qwen3_vocoder.study import carried_feeds

    product = qp.produce(codes_length)
    pins = {t.name: tuple(t.shape) for t in product.contract.inputs}
    sample = carried_feeds(product.path, steps=2)[-1]
    out = [FamilyGraph("qwen3_vocoder", "raw", f"step B={codes_length}, torchscript17, before the long-axis rewrite",
                       onnx.load(str(qp.produce(codes_length, long_axis=False).path)), sample=sample)]
    for exporter in exporters:
        graph = onnx.load(str(qp.produce(codes_length, exporter=exporter).path))
        dynamic = any(not d.HasField("dim_value") for i in graph.graph.input for d in i.type.tensor_type.shape.dim)
        out.append(FamilyGraph("qwen3_vocoder", "raw", f"step B={codes_length}, {exporter}", graph,
                               pins if dynamic else {}, sample))
    out.append(FamilyGraph("qwen3_vocoder", "rewritten", f"step B={codes_length}, produced (torchscript17, long axes "
                           "rewritten)", onnx.load(str(product.path)), sample=sample))
    return out


def lint_family(graphs: Iterable[FamilyGraph], target: str = "rk3588") -> list[tuple[FamilyGraph, Report]]:
    return [(fg, lint(fg.model, fg.inputs, target=target, sample=fg.sample)) for fg in graphs]


def summary_rows(linted) -> list[dict]:
    """One row per graph: severities counted, the codes that fired, the exit code `rkstudy lint` gives."""
    rows = []
    for fg, report in linted:
        by = Counter(f"{f.code} {f.severity}" for f in report.findings)
        rows.append({"family": fg.family, "stage": fg.stage, "graph": fg.label, "nodes": len(fg.model.graph.node),
                     **report.counts, "exit_code": report.exit_code,
                     "codes": ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(by.items())) or "-",
                     "target": report.target, "where": HOST.where})
    return rows


def finding_rows(linted) -> list[dict]:
    """Every finding of every graph (nodes counted, the first named)."""
    return [{"family": fg.family, "stage": fg.stage, "graph": fg.label, **f.row(), "target": report.target,
             "where": HOST.where} for fg, report in linted for f in report.findings]


def side_by_side(rows: list[dict]) -> list[dict]:
    """Raw against rewritten per family: the codes each stage leaves."""
    out = []
    for family in dict.fromkeys(r["family"] for r in rows):
        mine = [r for r in rows if r["family"] == family]
        for stage in ("raw", "rewritten"):
            these = [r for r in mine if r["stage"] == stage]
            out.append({"family": family, "stage": stage, "graphs": len(these),
                        "errors": sum(r["error"] for r in these), "warnings": sum(r["warning"] for r in these),
                        "exit_1": sum(r["exit_code"] == 1 for r in these),
                        "codes": "; ".join(f"{r['graph']}: {r['codes']}" for r in these)})
    return out


def cli_exit_codes(linted, workdir) -> list[dict]:
    """`rkstudy lint` run as a command on each graph (saved under `workdir`), and on inputs it must refuse:
    a corrupt file, an unknown input name, a shape that does not parse. The exit code and the first line."""
    from ..atomic import save_onnx

    rows = []

    def run(label: str, args: list[str], expected: int) -> None:
        proc = subprocess.run([sys.executable, "-m", "rkstudy", "lint", *args], capture_output=True, text=True,
                              timeout=1800)
        said = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        rows.append({"graph": label, "args": " ".join(a if not a.endswith((".onnx", ".npz")) else a.rsplit("/", 1)[-1]
                                                     for a in args[1:]),
                     "exit_code": proc.returncode, "expected": expected, "agrees": proc.returncode == expected,
                     "first_line": said[0] if said else "", "where": HOST.where, "target": "none"})

    first = None
    for k, (fg, report) in enumerate(linted):
        path = workdir / f"{fg.family}_{k}.onnx"
        save_onnx(fg.model, path)
        first = first or (path, fg)
        args = [str(path)] + [a for name, shape in fg.inputs.items()
                              for a in ("--input", f"{name}={'x'.join(map(str, shape))}")]
        if fg.sample is not None:  # the API's report ran the fp16 rules on it: so does the command
            np.savez(path.with_suffix(".npz"), **fg.sample)
            args += ["--sample", str(path.with_suffix(".npz"))]
        run(f"{fg.family}: {fg.label}", args, report.exit_code)
    path, fg = first
    corrupt = workdir / "corrupt.onnx"
    corrupt.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    run("corrupt copy of the first graph", [str(corrupt)], 2)
    run("unknown input name", [str(path), "--input", "no_such_input=1x2"], 2)
    run("a shape that does not parse", [str(path), "--input", f"{fg.model.graph.input[0].name}=1xNx3"], 2)
    return rows
