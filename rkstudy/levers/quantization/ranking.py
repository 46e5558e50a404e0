"""The toolkit's per-layer accuracy_analysis report (host), on more than one sample, and that ranking
turned into a hybrid on the search's footing.

Kept apart from the search because it is the toolkit's own answer: the lever measures what a hybrid of
its ranked layers loses, and the search is compared against it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ... import cache, graph
from ...graph.index import Index
from ...toolkit import macs
from ...toolkit.calibration import Calibration
from .stages import Stage, evenly
from .tensors import ANALYSIS_IO_OPS


def rank_layers(stage: Stage, target: str, calibration: Calibration, samples: int = 3) -> list[dict]:
    """The toolkit's per-layer report of the quantized build (rknn.accuracy_analysis on the simulator) on
    `samples` calibration samples evenly spread (the evaluation data stay unseen), averaged per layer,
    worst first: a layer whose range overflowed on any sample, then by the mean cosine of its output
    computed alone from fp32 inputs (`single_cos`, the error that layer adds by itself; its worst sample
    beside it). The inputs and the casts the report lists beside the layers are left out."""
    from ...toolkit.convert import accuracy_analysis_many

    feeds = evenly(range(len(stage.calibration)), samples)
    names = list(graph.input_shapes(stage.onnx))
    picked = "-".join(map(str, feeds))
    out = cache.cache_dir("analysis") / f"{stage.onnx.stem}-{target}-{calibration.key(names)}-{picked}"
    analyses = accuracy_analysis_many(stage.onnx, target, [dict(stage.calibration[i]) for i in feeds], out_dir=out,
                                      quantize=calibration)
    per: dict[str, list[dict]] = {}
    for analysis in analyses:
        for r in analysis:
            if r["op"] not in ANALYSIS_IO_OPS:
                per.setdefault(r["layer"], []).append(r)
    rows = [{"layer": layer, "op": rs[0]["op"], "samples": len(rs),
             "single_cos": float(np.mean([r["single_cos"] for r in rs])),
             "single_cos_worst": float(np.min([r["single_cos"] for r in rs])),
             "entire_cos": float(np.mean([r["entire_cos"] for r in rs])),
             "overflow": any(r["overflow"] for r in rs)} for layer, rs in per.items()]
    rows.sort(key=lambda r: (not r["overflow"], r["single_cos"]))
    return [{"stage": stage.name, "rank": i + 1, **r, "where": "simulator", "target": target}
            for i, r in enumerate(rows)]


# --- the accuracy_analysis ranking as a hybrid, on the search's footing ----------------------------------
def ranked_keep(stage: Stage, ranking: Sequence[Mapping], names: Sequence[str], n: int,
                fixed: Sequence[str]) -> list[str]:
    """The config tensors a hybrid of the `n` worst layers of `ranking` keeps in float16, on the search's
    footing: those layers, every config tensor of the same graph nodes (the compiler-made tiles and
    splits the report does not name), and `fixed` (the groups without conv MACs, which the search keeps
    in float16 too)."""
    index = Index(graph.load(stage.onnx, load_external_data=False))

    def node(name: str) -> str:
        kind, found = macs.locate(name, index)
        producer = index.producer.get(found) if kind == "tensor" else None
        return producer.name if producer is not None else found

    worst = {node(r["layer"]) for r in ranking[:n]} | {r["layer"] for r in ranking[:n]}
    return [t for t in names if t in worst or node(t) in worst or t in set(fixed)]
