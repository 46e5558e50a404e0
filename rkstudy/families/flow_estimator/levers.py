"""What the flow estimator stand-in offers the shared studies that build graphs from every family (host): its
sequence buckets for the multi-shape lever.
"""

from __future__ import annotations

from collections.abc import Sequence

from ... import gates
from ...levers import LeverGraphs
from ...levers.multi_shape import ShapeLadder
from ...runtime import OrtRunner


def shape_ladder(buckets: Sequence[int], depth: int = 2) -> ShapeLadder:
    """The stand-in's sequence buckets: a bucket-S engine is compiled from the graph exported and folded
    at S; the multi-shape engine from the largest bucket's. Scored against that graph in onnxruntime on
    the study's estimator-like feeds (90 % of the frames real)."""
    from functools import cache

    from . import producer

    graph_at = cache(lambda s: producer.produce(s, depth=depth))  # exported only when a build needs it
    widest = graph_at(max(buckets)).contract

    def shapes(s):
        return {t.name: [s if i == t.axis else d for i, d in enumerate(t.shape)] for t in widest.inputs}

    def score(s, feed, outs):
        return gates.snr_db(OrtRunner(graph_at(s).path).run(feed)[0], outs[0])

    return ShapeLadder(graph=f"flow estimator stand-in (depth {depth})", widths=tuple(buckets), shapes=shapes,
                       single=lambda s: graph_at(s).path, multi=graph_at(max(buckets)).path,
                       feed=lambda s: producer.feeds(graph_at(s).contract), score=score)


def lever_graphs(quick: bool) -> LeverGraphs:
    """Full mode: two buckets as one multi-shape engine (the fold bakes S in: two say whether the toolkit
    re-infers the rest)."""
    return LeverGraphs() if quick else LeverGraphs(shape_ladders=[shape_ladder((110, 200))])
