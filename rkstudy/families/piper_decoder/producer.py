"""Stage 1 of the Piper (VITS) decoder (host): slice at the inverse-flow input, pin, fold, mask,
and write the stage contract into the graph.

The seam is the pre-flow latent z [1,C,N] and its frame mask y_mask [1,1,N] (plus g for a
multi-speaker voice): the flow belongs to the decoder half, and the latent a runtime has on
hand is the pre-flow one. The slice is pinned to one window (RKNN has no dynamic shapes),
folded with onnxslim (the export sizes tensors through Shape -> ConstantOfShape, which the
compiler cannot fold), optionally given the decoder mask (rkstudy.graph.decmask), and stamped
with its contract in the ONNX metadata, so the conversion stage and the sidecar read the window,
hop and channels back out of the graph instead of restating them.

What is Piper-specific here is only the seam and the defaults; the Inflect v2 decoder
(rkstudy.families.inflect_decoder) runs the same producer with its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx

from ... import graph
from ...contract import METADATA_KEY, Contract, Digest, Tensor, WindowShape, from_metadata
from ...graph.decmask import mask_decoder
from ...produced import Produced
from ..piper.voice import DecoderModel, DecoderSeam, decoder_hop, find_decoder_seam, latent_channels
from . import DEFAULT_CONTEXT, DEFAULT_EMIT

FAMILY = "piper_decoder"
PRODUCER = "rkstudy piper decoder --voice-onnx <voice.onnx> --skip-rknn --output decoder_z.onnx"


@dataclass(kw_only=True)
class DecoderSlice(Produced):
    """A produced slice, held in memory (contract in its metadata), with its census before and after
    the fold."""

    before: graph.Census
    after: graph.Census

    def cache_name(self) -> str:
        c, p = self.contract, self.contract.params
        return (f"{c.family}_w{c.window.frames}_e{c.window.emit}{'_decmask' if p['dec_mask'] else ''}"
                f"{'_resize' if p['upsampler'] == 'resize' else ''}")


def decoder_graph(model: onnx.ModelProto, seam: DecoderSeam, window: int | None = None) -> onnx.ModelProto:
    """The decoder half with inputs named z / y_mask (/ g) and output audio; pinned to
    `window` frames when given, dynamic (any length, onnxruntime only) otherwise."""
    names = {seam.z: "z", seam.y_mask: "y_mask", seam.audio: "audio", **({seam.g: "g"} if seam.g else {})}
    sliced = graph.rename(graph.slice_at(model, seam.inputs, [seam.audio]), names)
    if window is None:
        return sliced
    return graph.pin_shapes(sliced, window_shapes(sliced, window))


def speaker_dims(model: onnx.ModelProto) -> int | None:
    """gin, the speaker embedding's width, when the slice has a `g` input."""
    g = next((i for i in model.graph.input if i.name == "g"), None)
    if g is None:
        return None
    dims = g.type.tensor_type.shape.dim
    if len(dims) < 2 or not dims[1].HasField("dim_value"):
        raise graph.SeamNotFound("the speaker input g has no fixed width; is this a VITS multi-speaker voice?")
    return dims[1].dim_value


def window_shapes(model: onnx.ModelProto, window: int) -> dict[str, tuple[int, ...]]:
    shapes = {"z": (1, latent_channels(model), window), "y_mask": (1, 1, window)}
    gin = speaker_dims(model)
    if gin is not None:
        shapes["g"] = (1, gin, 1)
    return shapes


def source_digest(path) -> Digest:
    return Digest.of(path)


def decoder_contract(*, family: str, window: int, emit: int, context: int, hop: int, channels: int,
                     gin: int | None, sample_rate: int, dec_mask: bool, upsampler: str, source: Digest,
                     producer: str, seam: DecoderSeam | None = None) -> Contract:
    """The stage contract of a windowed VITS decoder: z walked at 1/frame, y_mask made by the walker,
    g a constant (multi-speaker voices), audio out at `hop` samples per frame."""
    inputs = [Tensor("z", (1, channels, window), role="walked", axis=2),
              Tensor("y_mask", (1, 1, window), role="mask", axis=2)]
    if gin is not None:
        inputs.append(Tensor("g", (1, gin, 1), role="constant"))
    return Contract(family=family, stage="decoder", inputs=tuple(inputs),
                    outputs=(Tensor("audio", (1, 1, window * hop), role="walked", axis=2, rate=hop),),
                    source=source, producer=producer,
                    params={"hop": hop, "channels": channels, "sample_rate": sample_rate, "dec_mask": dec_mask,
                            "upsampler": upsampler if dec_mask else "", "speaker_dims": gin or 0,
                            # the seam's names in the source model: a board exposes them to get latents
                            "seam_z": seam.z if seam else "", "seam_g": (seam.g or "") if seam else ""},
                    window=WindowShape(frames=window, emit=emit, context=context, hop=emit))


def produce(model: onnx.ModelProto, *, source: Digest, emit: int = DEFAULT_EMIT, context: int = DEFAULT_CONTEXT,
            dec_mask: bool = False, upsampler: str = "convtranspose", sample_rate: int = 22050,
            family: str = FAMILY, seam: DecoderSeam | None = None, producer: str = PRODUCER) -> DecoderSlice:
    """Slice at the decoder seam, pin to one window, fold, optionally mask the decoder, and write
    the contract into the graph."""
    seam = seam or find_decoder_seam(model)
    window = emit + 2 * context
    pinned = decoder_graph(model, seam, window)
    before = graph.census(pinned)
    folded = graph.fold(pinned, window_shapes(pinned, window))
    if dec_mask:
        folded = mask_decoder(folded, "y_mask", upsampler=upsampler)
    after = graph.census(folded)
    contract = decoder_contract(family=family, window=window, emit=emit, context=context, hop=decoder_hop(model),
                                channels=latent_channels(model), gin=speaker_dims(pinned),
                                sample_rate=sample_rate, dec_mask=dec_mask, upsampler=upsampler,
                                source=source, producer=producer, seam=seam)
    return DecoderSlice(model=graph.with_metadata(folded, **{METADATA_KEY: contract.to_json()}), contract=contract,
                        before=before, after=after)


def produce_for_voice(voice: DecoderModel, **kw) -> DecoderSlice:
    """`produce` for anything with a model, seam, ONNX path and sample rate (a Voice, a DecodeModel);
    the contract records the command that makes the same slice."""
    kw.setdefault("family", voice.family)
    kw.setdefault("producer", voice.producer_command(emit=kw.get("emit", DEFAULT_EMIT),
                                                     context=kw.get("context", DEFAULT_CONTEXT),
                                                     dec_mask=kw.get("dec_mask", False)))
    return produce(voice.model, source=source_digest(voice.onnx_path), sample_rate=voice.sample_rate,
                   seam=voice.seam, **kw)


def read_contract(model, remake: str = PRODUCER) -> Contract:
    """The contract a produced slice carries (EngineMismatch naming `remake` when it has none)."""
    name = Path(model).name if isinstance(model, (str, Path)) else "this ONNX"
    return from_metadata(graph.metadata(model), where=name, remake=remake)
