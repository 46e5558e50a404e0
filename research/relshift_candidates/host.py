"""Host-side pieces of the relshift candidates study: folded encoders, fp32 references, the fp32 gates.

Builds are not run here (see measure.py, one fresh process per build); this module only makes
ONNX files and numpy references, so it can run while no toolkit child is alive.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

from rkstudy import graph
from rkstudy.families.piper import voice as piper
from rkstudy.families.piper_encoder import producer, seam, tokens
from rkstudy.paths import REPO
from rkstudy.runtime import OrtRunner

HERE = Path(__file__).resolve().parent
OUT = REPO / "build" / "relshift_candidates"  # folded/rewritten ONNX, references, one JSON row per build
EXACT_DB = 120.0  # the exactness gate in fp32: >= 120 dB and max |diff| <= 1e-5 against the raw slice
EXACT_MAX_DIFF = 1e-5


def folded(voice: piper.Voice, width: int) -> onnx.ModelProto:
    """The pinned, onnxslim-folded encoder slice at `width` (cached under out/)."""
    path = OUT / "folded" / f"enc_fold_L{width}.onnx"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(graph.fold(seam.encoder_slice(voice.model), seam.shapes_for(width)), str(path))
    return onnx.load(str(path))


def references(voice: piper.Voice, width: int, counts: Sequence[int] | None = None, tag: str = "") -> Path:
    """npz for measure.py: padded engine feeds and the exact-length fp32 raw slice outputs at
    `counts` (default: the reference documents' token counts {17, 61, N-1, N}, piper_encoder.counts_for);
    `tag` names a non-default set of counts."""
    path = OUT / "refs" / f"refs_L{width}{tag}.npz"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = OrtRunner(seam.encoder_slice(voice.model))
    arrays = {}
    for n in counts or producer.counts_for(width):
        ids = tokens.real_tokens(voice, n)
        feed = tokens.pad_ids(ids, width)
        stats, cond = raw.run(piper.ids_feed(ids))
        arrays.update({f"feed_input_{n}": feed["input"], f"feed_lengths_{n}": feed["input_lengths"],
                       f"stats_{n}": stats, f"cond_{n}": cond})
    np.savez(path, **arrays)
    return path


def fp32_rows(voice: piper.Voice, width: int, fold: onnx.ModelProto, rewritten: onnx.ModelProto,
              counts: Sequence[int] | None = None) -> list[dict]:
    """The rewritten graph, padded to `width`, against the exact-length raw slice (the exactness
    gate and the pad-safety gate at once: piper_encoder.pad_safety compares the same pair) and
    against the folded graph at the same padding (what the rewrite alone changed)."""
    raw, ref_fold, test = (OrtRunner(seam.encoder_slice(voice.model)), OrtRunner(fold), OrtRunner(rewritten))
    rows = []
    for n in counts or producer.counts_for(width):
        ids = tokens.real_tokens(voice, n)
        padded = tokens.pad_ids(ids, width)
        got = test.run(padded)
        vs_raw = producer.both(raw.run(piper.ids_feed(ids)), got, n)
        vs_fold = producer.both(ref_fold.run(padded), got, n)
        snr = min(vs_raw["stats_snr_db"], vs_raw["cond_snr_db"])
        diff = max(vs_raw["stats_max_diff"], vs_raw["cond_max_diff"])
        rows.append({"frames": width, "tokens": n, "pad_slots": width - n, **vs_raw,
                     "vs_folded_max_diff": max(vs_fold["stats_max_diff"], vs_fold["cond_max_diff"]),
                     "worst_snr_db": snr, "worst_max_diff": diff,
                     "exact": bool(snr >= EXACT_DB and diff <= EXACT_MAX_DIFF),
                     "pad_safe": producer.PAD_SAFE_GATE.passes(snr)})
    return rows
