"""Stage 1 of the stateful Piper decoder (host): the produced --dec-mask slice -> one stateful step
of E frames by graph surgery (rkstudy.graph.stateful), and its stage contract.

Graph surgery and not a re-trace: the rules need only the ONNX op types, so the weights are used as
exported (nothing is re-exported into new build hazards), and the same call turns the Inflect v2
decode.onnx (head included) into an exact step. The slice is piper_decoder's own producer output
with the decoder mask: the mask makes every conv input zero outside the utterance, as the
full-length decode's padding is, which is what makes the first and the last samples exact.

The contract (rkstudy.contract, the one every family uses): the latent `z` walked at 1 per frame
over `emit` frames, `y_mask` a mask the walker makes (0 on the flush frames), `g` a constant
(multi-speaker voices), one `state` tensor per channel count, each paired with its output, no
window; `params` carry the step size, the lookahead, and the state layout (how the walker's one
flat vector splits into the engine's state tensors).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import graph
from ...contract import METADATA_KEY, Contract, Digest, step_contract
from ...graph.decmask import mask_decoder
from ...graph.stateful import StepGraph, make_step
from ...produced import Produced
from ..piper.voice import DecoderModel
from ..piper_decoder.producer import DecoderSlice, produce_for_voice

FAMILY = "piper_decoder_stateful"
DEFAULT_EMIT = 45
PRODUCER = "rkstudy piper decoder --stateful --emit 45 --skip-rknn --output decoder_step.onnx"
METHOD = "graph surgery (rkstudy.graph.stateful.make_step) on the folded, decoder-masked slice"


@dataclass(kw_only=True)
class StatefulStep(Produced):
    """A stateful step, held in memory (contract in its metadata), with the surgery's record (delay
    map, state groups and buffers) and the slice it was cut from."""

    step: StepGraph
    slice: DecoderSlice | None = None

    def cache_name(self) -> str:
        return f"{self.contract.family}_e{self.contract.params['emit']}"


def stamped(step: StepGraph, contract: Contract, sliced: DecoderSlice | None = None) -> StatefulStep:
    return StatefulStep(model=graph.with_metadata(step.model, **{METADATA_KEY: contract.to_json()}), contract=contract,
                        step=step, slice=sliced)


def produce_step_for_voice(voice: DecoderModel, emit: int = DEFAULT_EMIT, *, producer: str | None = None,
                           layout: str = "grouped") -> StatefulStep:
    """The stateful step of `voice`'s decoder at `emit` frames: piper_decoder's --dec-mask slice
    (any window length: the surgery re-pins it), cut into a step; the contract records the command
    that makes the same step."""
    sliced = produce_for_voice(voice, dec_mask=True)
    step = make_step(sliced.model, ["z", "y_mask"], emit, layout=layout)
    p = sliced.contract.params
    keep = ("hop", "channels", "sample_rate", "dec_mask", "upsampler", "speaker_dims", "seam_z", "seam_g")
    producer = producer or (f"rkstudy piper decoder --voice-onnx {voice.onnx_path.name} --stateful --emit {emit} "
                            f"--skip-rknn --output decoder_step.onnx")
    contract = step_contract(step, family=FAMILY, masks=("y_mask",), source=sliced.contract.source,
                             producer=producer, params={k: p[k] for k in keep}, method=METHOD)
    return stamped(step, contract, sliced)


def produce_inflect_step(decode, emit: int, frames: int = 97) -> StatefulStep:
    """The same surgery on the whole Inflect v2 decode.onnx (head z = m_p + exp(logs_p) * zp_noise *
    noise_scale included, noise_scale a constant), folded at any length and decoder-masked: the
    check that the method is generic. `decode` is an inflect_decoder DecodeModel. Made by notebook 01b;
    there is no command for it."""
    c = decode.channels
    shapes = {"m_p": (1, c, frames), "logs_p": (1, c, frames), "zp_noise": (1, c, frames), "noise_scale": (1,),
              "y_mask": (1, 1, frames)}
    folded = mask_decoder(graph.fold(decode.model, shapes), "y_mask")
    step = make_step(folded, ["m_p", "logs_p", "zp_noise", "y_mask"], emit)
    contract = step_contract(step, family="inflect_decoder", masks=("y_mask",),
                             source=Digest.of(decode.onnx_path),
                             producer="rkstudy.families.piper_decoder_stateful.producer.produce_inflect_step "
                                      "(notebook 01b; no command)",
                             params={"hop": decode.hop, "channels": c, "sample_rate": decode.sample_rate,
                                     "dec_mask": True, "upsampler": "convtranspose"}, method=METHOD)
    return stamped(step, contract)


def state_probe(onnx_path, contract: Contract, steps: int = 3, seed: int = 0) -> list[dict]:
    """Stage 2's probe for a stateful step: the inputs of its first step (zero state) and of step
    `steps` (the state the fp32 graph carried there) on a white-noise latent, so the simulator gate
    covers the cache path too, not only a zero state."""
    from ...runtime import OrtRunner
    from ...walk.stateful import carried_feeds

    rng = np.random.default_rng(seed)
    constants = {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in contract.role("constant")}
    e = contract.params["emit"]
    frames = {t.name: rng.standard_normal(t.shape[1:-1] + (steps * e * t.rate,)).astype(np.float32)
              for t in contract.role("walked")}
    feeds = carried_feeds(OrtRunner(onnx_path), contract, frames, constants)
    return [feeds[0], feeds[-1]]
