"""Notebook 03 section 4: the folded graph's census, the padded-window gate and the export gate."""

from __future__ import annotations

from ...tables.results import HOST
from . import frontend
from .generator import Rewrites
from .producer import (
    DEFAULT_CONTEXT,
    DEFAULT_FRAMES,
    KokoroModel,
    Produced,
    last_window_feed,
    padded_window_snr,
    produce,
)
from .rows import FP32


def census_row(produced: Produced) -> dict:
    c = produced.census
    return {"window": produced.contract.window.frames, "rewrites": produced.contract.params["rewrites"],
            "max_axis": produced.contract.params["max_axis"], **c.row(),
            "ops": " ".join(f"{k}:{v}" for k, v in c.ops.most_common()), "where": HOST.where, "target": HOST.target}


def padded_window_rows(model: KokoroModel, cases, frames: int = DEFAULT_FRAMES) -> list[dict]:
    """n real frames at several positions in a padded window against the same n frames decoded at
    their own length (the gate: producer.PADDED_GATE)."""
    from .producer import PADDED_GATE

    trunk = model.trunk()
    rows = []
    for name, start, real in cases:
        snr = padded_window_snr(trunk, model.utterance(name), start, real, frames)
        rows.append({"utterance": name, "start": start, "real": real, "window": frames, **PADDED_GATE.row(snr), **FP32})
    return rows


def export_gate_rows(model: KokoroModel, utt: frontend.Utterance, frames: int = DEFAULT_FRAMES,
                     context: int = DEFAULT_CONTEXT, sines=("poly", "exact")) -> list[dict]:
    """The exported ONNX against the torch graph it was traced from, on the last window of the walk
    over `utt`, the torch reference in the same sine form (producer.EXPORT_GATE)."""
    from .producer import EXPORT_GATE, export_snr

    rows = []
    feed = last_window_feed(utt, frames, context)
    for sine in sines:
        rw = Rewrites(sine=sine)
        snr = export_snr(produce(frames, context, rw).path, model.trunk(rw), feed)
        rows.append({"utterance": utt.name, "window": frames, "sine": rw.tag(), **EXPORT_GATE.row(snr), **FP32})
    return rows
