"""The Kokoro generator's graphs as the lint study lints them (host; full runs only, the re-trace is
slow): the re-traced trunk with no rewrites (weight norm traced, exact sine, no masks) against the
engine's graph; the exact sine left alone; and the monolithic wide window (raw-sum statistics, the
RKNN decoder-path document's form) against the in-graph walk (notebook 03's: inner windows of 134
frames, whose largest REGTASK field value stays inside 8191)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx

from ...lint.study import FamilyGraph

FRAMES, WIDE = 128, 256
MAX_AXIS = 60 * 134 + 1


def lint_graphs(quick: bool) -> list[FamilyGraph]:
    if quick:
        return []
    from . import producer as kp
    from .generator import ENGINE, REFERENCE, Rewrites

    model = kp.load_model()
    utt = model.utterance(kp.PROBE_UTTERANCE)

    def sample(w: int, names=kp.INPUTS) -> dict[str, np.ndarray]:
        feed = kp.window_feed(utt.x, utt.har, utt.style, 0, min(utt.frames, w), w)
        return {k: feed[k] for k in names}

    def produced(frames: int, **kw) -> onnx.ModelProto:
        return onnx.load(str(kp.produce(frames, model=model, **kw).path))

    raw = kp.export(model.trunk(replace(REFERENCE, weight_norm=True)),
                    {k: v for k, v in kp.window_shapes(FRAMES).items() if k in ("x", "har", "style")},
                    fold=False, constant_folding=False)
    return [FamilyGraph("kokoro_generator", "raw", f"trunk at W={FRAMES}: no rewrites (weight norm traced, exact "
                        "sine, unmasked)", raw, sample=sample(FRAMES, ("x", "har", "style"))),
            FamilyGraph("kokoro_generator", "raw", f"every exact rewrite at W={FRAMES}, exact sine",
                        produced(FRAMES, rw=Rewrites(sine="exact")), sample=sample(FRAMES)),
            FamilyGraph("kokoro_generator", "rewritten", f"the engine's graph at W={FRAMES}",
                        produced(FRAMES, rw=ENGINE), sample=sample(FRAMES)),
            FamilyGraph("kokoro_generator", "raw", f"W={WIDE} in one window, raw-sum statistics",
                        produced(WIDE, rw=Rewrites(stats="sum")), sample=sample(WIDE)),
            FamilyGraph("kokoro_generator", "rewritten", f"W={WIDE} walked in the graph (--max-axis {MAX_AXIS})",
                        produced(WIDE, rw=ENGINE, max_axis=MAX_AXIS), sample=sample(WIDE))]
