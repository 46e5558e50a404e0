"""Stage 1 of the port path (host): a user's ONNX and the flags that say what it cannot -> the
window graph (pinned, folded, validity-masked, its contract in the metadata) and the stateful step.

The flag convention, one rate per tensor, counted per latent frame:

* `--walk NAME:AXIS:RATE`: a walked input, its frame axis (the last one: the walkers cut frames on
  the last axis) and its elements along that axis per latent frame (1 for a mel spectrogram);
* `--output NAME:RATE`: a walked output and its samples per latent frame (the hop: 256 for a
  22.05 kHz HiFi-GAN, 1 for a spectrum-frame output);
* `--static NAME`: an input fed unchanged on every window or step (a speaker embedding);
* `--frames N`: the compiled length in latent frames (the window, or the pinned length the step is
  cut from).

Every graph input is named once, walked or static; the graph's dims other than the frame axis
must be fixed (a dynamic batch dim is pinned to 1). Inside the graph time may sit on any axis (a
Vocos backbone transposes to [B, T, C] around its LayerNorms): the streaming rules track it tensor by
tensor, and each walked output's frame axis in the contract is the one they find. The window graph
gets the boundary pass of rkstudy.graph.validity where the graph streams (length masks, and edge or
reflect pads rewritten from the frame mask), so a window padded past the end of a short input reads
the full decode's own boundary; the step is rkstudy.graph.stateful.make_step, exact at both ends (a
graph that cannot stream is refused with the node that breaks it: delays.NotStreamable).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx

from ... import graph
from ...contract import METADATA_KEY, Contract, Digest, Tensor, WindowShape, from_metadata, step_contract
from ...errors import UsageError
from ...graph.delays import NotStreamable, time_axes
from ...graph.pitfalls import attention
from ...graph.stateful import StepGraph, make_step
from ...graph.validity import mask_boundaries
from ...produced import Produced
from .export import lengths, refuse_random

FAMILY = "port"
PRODUCER = "rkstudy port fold <model.onnx> --walk NAME:AXIS:RATE --output NAME:RATE --frames N --save X"


@dataclass(frozen=True)
class Walked:
    name: str
    axis: int
    rate: int


@dataclass(frozen=True)
class Port:
    """A user's model and what the flags say about it."""

    path: Path
    model: onnx.ModelProto
    walked: tuple[Walked, ...]
    static: tuple[str, ...]
    outputs: tuple[tuple[str, int], ...]     # (name, samples per latent frame)

    @property
    def hop(self) -> int:
        return self.outputs[0][1]

    @property
    def walked_names(self) -> list[str]:
        return [w.name for w in self.walked]

    def shapes(self, frames: int) -> dict[str, tuple[int, ...]]:
        """Every input's shape with `frames` latent frames on the walked inputs' frame axis."""
        out = {}
        rates = {w.name: w for w in self.walked}
        for vi in self.model.graph.input:
            if vi.name not in rates and vi.name not in self.static:
                continue
            dims, rank = [], len(vi.type.tensor_type.shape.dim)
            for k, d in enumerate(vi.type.tensor_type.shape.dim):
                if vi.name in rates and k == rank - 1:
                    dims.append(rates[vi.name].rate * frames)
                elif d.HasField("dim_value"):
                    dims.append(d.dim_value)
                elif k == 0:
                    dims.append(1)   # a dynamic batch: one utterance at a time
                else:
                    raise UsageError(f"input {vi.name} has a dynamic dim {k} ({d.dim_param or '?'}) that is not its "
                                     f"frame axis; pin it first with `rkstudy fold {self.path.name} --shape ...`")
            out[vi.name] = tuple(dims)
        return out


def _parse(text: str, flag: str, parts: int, example: str) -> list[str]:
    fields = text.split(":")
    if len(fields) != parts or not all(fields):
        raise UsageError(f"{flag} {text!r}: expected {example}")
    return fields


def _int(text: str, flag: str, whole: str, example: str, minimum: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{flag} {whole!r}: {text!r} is not an integer; expected {example}") from None
    if minimum is not None and value < minimum:
        raise UsageError(f"{flag} {whole!r}: {value} must be at least {minimum}; expected {example}")
    return value


def port_from_flags(path, walk: Sequence[str], static: Sequence[str] = (), output: Sequence[str] = ()) -> Port:
    """The Port the flags describe, every name checked against the graph (UsageError, one line)."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path}: no such ONNX file")
    model = graph.load(path)
    init = {i.name for i in model.graph.initializer}
    inputs = {vi.name: len(vi.type.tensor_type.shape.dim) for vi in model.graph.input if vi.name not in init}
    outputs = [o.name for o in model.graph.output]
    if not walk:
        raise UsageError("name the walked input: --walk NAME:AXIS:RATE (such as --walk mel:2:1)")
    if not output:
        raise UsageError("name the walked output: --output NAME:RATE (such as --output audio:256)")
    walked = []
    for text in walk:
        name, axis, rate = _parse(text, "--walk", 3, "NAME:AXIS:RATE, such as mel:2:1")
        axis = _int(axis, "--walk", text, "NAME:AXIS:RATE, such as mel:2:1")
        rate = _int(rate, "--walk", text, "NAME:AXIS:RATE, such as mel:2:1", minimum=1)
        if name not in inputs:
            raise UsageError(f"--walk {text}: the graph has no input {name!r}; its inputs: {', '.join(inputs)}")
        if axis % max(inputs[name], 1) != inputs[name] - 1:
            raise UsageError(f"--walk {text}: the frame axis must be the last one ({inputs[name] - 1} for {name}): "
                             "the walkers cut frames on the last axis; transpose the input in the export")
        walked.append(Walked(name, inputs[name] - 1, rate))
    for name in static:
        if name not in inputs:
            raise UsageError(f"--static {name}: the graph has no input {name!r}; its inputs: {', '.join(inputs)}")
    outs = []
    for text in output:
        name, rate = _parse(text, "--output", 2, "NAME:RATE, such as audio:256")
        rate = _int(rate, "--output", text, "NAME:RATE, such as audio:256", minimum=1)
        if name not in outputs:
            raise UsageError(f"--output {text}: the graph has no output {name!r}; its outputs: {', '.join(outputs)}")
        outs.append((name, rate))
    named = [w.name for w in walked] + list(static)
    twice = sorted({n for n in named if named.count(n) > 1})
    if twice:
        raise UsageError(f"{', '.join(twice)} named twice; give each input once, --walk or --static")
    unnamed = [n for n in inputs if n not in named]
    if unnamed:
        raise UsageError(f"the graph's input(s) {', '.join(unnamed)} are not named; give each --walk or --static")
    port = Port(path, model, tuple(walked), tuple(static), tuple(outs))
    refuse_random(port)   # every command starts here: none folds a random draw into constants
    return port


def folded(port: Port, frames: int) -> onnx.ModelProto:
    """The graph pinned to `frames` latent frames, constant-folded, unlisted outputs dropped."""
    keep = [o for o, _ in port.outputs]
    model = port.model
    if keep != [o.name for o in model.graph.output]:
        model = graph.slice_at(model, port.walked_names + list(port.static), keep)
    return graph.fold(graph.pin_shapes(model, port.shapes(frames)), port.shapes(frames))


@dataclass(kw_only=True)
class PortGraph(Produced):
    """A produced port graph (window or step) with its contract (also in its metadata), what the
    boundary pass did to it (the nodes whose inputs it masked, the pads it rewrote) and, for a step,
    the surgery's record."""

    masked: tuple[str, ...] = ()
    rewritten: tuple[str, ...] = ()
    step: StepGraph | None = None

    def cache_name(self) -> str:
        c = self.contract
        tag = f"w{c.window.frames}_e{c.window.emit}" if c.window else f"step_e{c.params['emit']}"
        return f"port_{Path(c.source.file).stem}_{tag}"


def _shape(model: onnx.ModelProto, name: str) -> tuple[int, ...]:
    for vi in list(model.graph.input) + list(model.graph.output):
        if vi.name == name:
            return tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
    raise KeyError(name)


def _params(port: Port, sample_rate: int) -> dict:
    return {"hop": port.hop, "sample_rate": sample_rate, "walked": {w.name: w.rate for w in port.walked},
            "static": list(port.static), "outputs": dict(port.outputs)}


def output_axes(port: Port, model: onnx.ModelProto) -> dict[str, int]:
    """Each walked output's frame axis, as the streaming rules track it from the walked inputs (the last
    axis where time does not reach the output through rules they know, or the inputs are not at one
    element per frame)."""
    axes = {o: len(_shape(model, o)) - 1 for o, _ in port.outputs}
    if all(w.rate == 1 for w in port.walked):
        dm = time_axes(model, port.walked_names)
        axes.update({o: dm.axis(o) for o in axes if o in dm.timing})
    return axes


def produce_window(port: Port, frames: int, context: int, *, sample_rate: int = 22050,
                   producer: str = PRODUCER) -> PortGraph:
    """The window graph of `frames` = emit + 2 x context latent frames and its contract. Where the
    graph streams (every walked input at one element per frame), the boundary pass makes every read
    past a tensor's ends see the full decode's boundary (length masks, edge and reflect pads rewritten)
    from a frame mask the walker makes; a graph that cannot stream is windowed as it is (its tail
    windows then read conv biases past the end)."""
    if not 0 <= 2 * context < frames:
        raise UsageError(f"--context {context} leaves no frame to emit in a {frames}-frame window; "
                         f"take a context below {(frames + 1) // 2}")
    extra = lengths(port, frames).extra
    model, mask, masked, rewritten = folded(port, frames), None, (), ()
    if all(w.rate == 1 for w in port.walked):
        try:
            valid = mask_boundaries(model, port.walked_names)
            model, mask, masked, rewritten = valid.model, valid.mask, valid.masked, valid.rewritten
        except NotStreamable:
            pass
    axes = output_axes(port, model)
    inputs = [Tensor(w.name, _shape(model, w.name), role="walked", axis=w.axis, rate=w.rate) for w in port.walked]
    if mask:
        inputs.append(Tensor(mask, _shape(model, mask), role="mask", axis=2))
    inputs += [Tensor(s, _shape(model, s), role="constant") for s in port.static]
    outputs = [Tensor(o, _shape(model, o), role="walked", axis=axes[o], rate=r, extra=extra[o])
               for o, r in port.outputs]
    for t in outputs:
        if t.shape[t.axis] != t.rate * frames + t.extra:
            raise UsageError(f"--output {t.name}:{t.rate}: pinned at {frames} frames the graph makes {t.shape[t.axis]} "
                             f"samples on its frame axis {t.axis}, and {t.rate * frames + t.extra} on its last axis as "
                             "exported; walk an output whose frame axis is its last")
    contract = Contract(family=FAMILY, stage="vocoder", inputs=tuple(inputs), outputs=tuple(outputs),
                        source=Digest.of(port.path), producer=producer,
                        params={**_params(port, sample_rate), "masked_convs": len(masked),
                                "rewritten_pads": len(rewritten)},
                        window=WindowShape(frames=frames, emit=frames - 2 * context, context=context,
                                      hop=frames - 2 * context))
    return PortGraph(model=graph.with_metadata(model, **{METADATA_KEY: contract.to_json()}), contract=contract,
                     masked=masked, rewritten=rewritten)


def produce_step(port: Port, emit: int, frames: int, *, sample_rate: int = 22050,
                 producer: str = PRODUCER) -> PortGraph:
    """The stateful step of `emit` frames, cut from the graph pinned at `frames` (any length: the
    surgery re-pins it), with its contract. NotStreamable (exit 2) names the node where it cannot."""
    bad = [f"{w.name} ({w.rate} per frame)" for w in port.walked if w.rate != 1]
    if bad:
        raise NotStreamable(f"a stateful step walks inputs at one element per frame; {', '.join(bad)} is not")
    model = folded(port, frames)
    refuse_attention(port, model, frames)
    extra = lengths(port, frames, step=True).extra
    step = make_step(model, port.walked_names, emit)
    if step.output_rate != port.hop:
        raise UsageError(f"--output {port.outputs[0][0]}:{port.hop}: the graph makes {step.output_rate} samples "
                         "per input frame; give that rate")
    if step.extents != extra:
        raise NotStreamable(f"the streaming rules make the outputs {step.extents} samples past rate x frames, the "
                            f"export runs {extra} past it; a rule reads this graph wrongly: report it with the graph")
    contract = step_contract(step, family=FAMILY, masks=(), source=Digest.of(port.path), producer=producer,
                             params={**_params(port, sample_rate), "output_extra": extra}, stage="vocoder")
    return PortGraph(model=graph.with_metadata(step.model, **{METADATA_KEY: contract.to_json()}), contract=contract,
                     masked=step.masked, rewritten=step.rewritten, step=step)


def refuse_attention(port: Port, model: onnx.ModelProto, frames: int) -> None:
    """NotStreamable naming the attention over time a pinned graph holds, with the span it attends over."""
    found = attention(model)
    if not found:
        return
    a = found[0]
    span = (f"over windows of {a.span} of its {frames} frames (windowed local attention)" if 0 < a.span < frames
            else f"over all {a.span} frames" if a.span == frames else f"over spans of {a.span} positions")
    more = f" ({len(found)} attention blocks)" if len(found) > 1 else ""
    raise NotStreamable(f"{port.path.name} attends {span}: MatMul {a.scores!r} -> Softmax {a.softmax!r} -> MatMul "
                        f"{a.values!r}{more}; no stateful step reproduces it at a window's edges. Walk it in windows "
                        "(rkstudy port fold), or cut the graph after the attention and run that part on the CPU")


def read_contract(model) -> Contract:
    name = Path(model).name if isinstance(model, (str, Path)) else "this ONNX"
    return from_metadata(graph.metadata(model), where=name, remake=PRODUCER)
